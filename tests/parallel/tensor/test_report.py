"""The report tables from hand-made rank results: maxima over ranks, formulas beside counts, no GPU needed."""
from labkit.parallel.tensor import report as tp_report
from labkit.parallel.tensor.megatron import LayerShape

SHAPE = LayerShape(seq_len=8, batch=2, d_model=16, heads=4)


def _rank(rank: int, wire: int | None) -> dict:
    phase = {"calls": {"all_reduce": 2, "reduce_scatter": 0, "all_gather": 0}, "nominal_bytes": 1024.0,
             "wire_bytes": wire}
    part = {"out_diff": 1e-7 * (rank + 1), "x_grad_diff": 0.0, "grad_diff": 0.0, "params": 10,
            "phases": {"forward": phase, "backward": phase}, "saved": {"norm": 4, "split": 8},
            "comm_forward": {"all_reduce": 2}, "comm_backward": {"all_reduce": 2}}
    return {"rank": rank, "unsplit_params": 20, "unsplit_saved": {"norm": 4, "split": 16},
            **{k: dict(part) for k in tp_report.KINDS}}


def test_exactness_takes_the_worst_rank():
    rows = tp_report.exactness_rows({2: [_rank(0, 1), _rank(1, 1)]})
    assert len(rows) == len(tp_report.KINDS) and rows[0]["out_diff"] == 2e-7


def test_comm_rows_put_the_formula_beside_the_count_and_miss_wire_bytes_on_nccl():
    rows = tp_report.comm_rows({2: [_rank(0, 1100), _rank(1, 1200)]}, SHAPE)
    assert rows[0]["collectives"] == "2 all_reduce" and rows[0]["wire_bytes"] == 1200
    assert rows[0]["formula_bytes"] == 2 * 2 * 8 * 16 * 4 * 1.0      # half of 4 ring all-reduces of b*s*h fp32
    nccl = tp_report.comm_rows({2: [_rank(0, None), _rank(1, None)]}, SHAPE)
    assert all(r["wire_bytes"] is None for r in nccl)
    assert tp_report.dtensor_comm_rows({2: [_rank(0, 1)]})[0]["CommDebugMode forward"] == {"all_reduce": 2}


def test_memory_rows_predict_matrices_over_t_and_the_rest_whole():
    rows = tp_report.memory_rows({2: [_rank(0, 1)]}, SHAPE)
    assert rows[0]["predicted_params"] == (20 - 6 * 16) // 2 + 6 * 16
    assert rows[0]["unsplit_split_over_t"] == 8
