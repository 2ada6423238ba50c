"""Storage and schedule upkeep, run by the maintenance sweep.

`maintenance` (the sweep: rebuild a lost schedule, schedule flagged rows, and call the
rest), `partitions` + `partition_conversion` + `partition_statistics` (PostgreSQL's day
partitions), `retention` (pruning finished history), `sampling` (the dashboards' history
rows) and `signals` (the schedule kept in step with what operators change).
"""
