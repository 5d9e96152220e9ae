"""What goes wrong on many ranks, and how to find it (notebooks 09 and 09b).

hangs (hangs provoked on real ranks) < flight_recorder (each rank's last collectives, read back) < diagnose (a training
function run with the instruments on); drift (replicas whose weights part silently); data_pitfalls and rank_pitfalls
(the classic multi-GPU mistakes, broken then fixed); hang_exercises and exercises (09 and 09b's checked exercises).
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["data_pitfalls", "diagnose", "drift", "exercises", "flight_recorder", "hang_exercises", "hangs", "rank_pitfalls"]
