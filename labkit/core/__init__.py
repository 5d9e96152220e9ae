"""The kit's own machinery: mode and devices, the one clock, data, models, fresh processes, run directories,
validation, progress bars, the lesson log and the doctor (notebook 00).
"""
