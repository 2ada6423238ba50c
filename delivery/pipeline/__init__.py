"""The send pipeline: from a committed delivery row to its recorded outcome.

In the order a delivery meets them: `enqueueing` (rows into the schedule, on commit),
`engine` (one worker process's threads: pick, request loop, release, record),
`loading` (a pick's rows), `sending` (one delivery end to end, and every decision about
it), `transport` + `curl_loop` (HTTP on libcurl), `policy` (an outcome's fate),
`records` + `endpoint_health` (what is written, and when an endpoint is disabled).
"""
