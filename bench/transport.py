"""CPU per POST of the delivery transport against other HTTP clients, in one run.

    .venv/bin/python bench/transport.py [--requests 3000] [--rounds 5]

One thread posts 512-byte bodies with Standard Webhooks-sized headers to a local
keep-alive receiver (bench/delivery.py's, in its own process, answering 200 at once),
four ways, interleaved round by round so the machine's noise hits all of them alike:

- requests: a `requests.Session` (trust_env off, stream=True, no redirects), reading the
  body to its end: what delivery/pipeline/transport.py was first built on;
- urllib3: `PoolManager.urlopen` with no retries, no redirects, reading the body: what
  it was built on next (urllib3 comes with requests);
- pycurl bare: one `pycurl.Curl` set up once and performed again and again (URL, body,
  headers and a write callback, nothing else): the floor of libcurl from Python;
- Transport.post: the platform's (libcurl through pycurl: a handle from the free list,
  every option set again per request, the SSRF guard on each new connection, the total
  deadline, the capped read, header parsing in Python).

Reported: the median over rounds of process CPU time per POST (the receiver's CPU is
not counted) and the ratios. Only this thread runs, so CPU time is what it costs
(libcurl's threaded resolver is not involved: the URL's host is an IP address).
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pycurl
import requests
import urllib3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.delivery import Receiver  # noqa: E402
from delivery.pipeline import transport  # noqa: E402

BODY = b'{"type": "order.created", "data": "' + b"x" * 470 + b'"}'
HEADERS = {
    "Content-Type": "application/json",
    "User-Agent": "fairhooks/0.1 (+webhook delivery)",
    "webhook-id": "01J" + "A" * 23,
    "webhook-timestamp": "1764720000",
    "webhook-signature": "v1," + "b" * 44,
}


def requests_post(url: str) -> Callable[[], int]:
    session = requests.Session()
    session.trust_env = False

    def post() -> int:
        response = session.post(
            url, data=BODY, headers=HEADERS, allow_redirects=False, stream=True, timeout=(5, 10)
        )
        response.raw.read(20_000)
        response.close()
        return response.status_code

    return post


def urllib3_post(url: str) -> Callable[[], int]:
    pool = urllib3.PoolManager(maxsize=4)

    def post() -> int:
        response = pool.urlopen(
            "POST",
            url,
            body=BODY,
            headers=HEADERS,
            redirect=False,
            retries=False,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=10),
        )
        response.read(20_000)
        response.release_conn()
        return response.status

    return post


def pycurl_bare(url: str) -> Callable[[], int]:
    curl = pycurl.Curl()
    curl.setopt(pycurl.URL, url)
    curl.setopt(pycurl.POSTFIELDS, BODY)
    curl.setopt(pycurl.HTTPHEADER, [f"{name}: {value}" for name, value in HEADERS.items()])
    chunks: list[bytes] = []
    curl.setopt(pycurl.WRITEFUNCTION, chunks.append)

    def post() -> int:
        chunks.clear()
        curl.perform()
        return curl.getinfo(pycurl.RESPONSE_CODE)

    return post


def transport_post(url: str) -> Callable[[], int]:
    session = transport.Transport(max_idle_handles=4, allow_private=True)

    def post() -> int:
        result = session.post(
            url,
            BODY,
            HEADERS,
            connect_timeout=5,
            total_timeout=10,
            response_cap_bytes=20_000,
        )
        return result.status_code or 0

    return post


def cpu_ms_per_post(post: Callable[[], int], count: int) -> float:
    started = time.process_time()
    for _ in range(count):
        status = post()
        if status != 200:
            raise SystemExit(f"the receiver answered {status}")
    return (time.process_time() - started) / count * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="POSTs per way per round")
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    receiver = Receiver()
    try:
        ways = {
            "requests.Session": requests_post(receiver.url),
            "urllib3 PoolManager": urllib3_post(receiver.url),
            "pycurl bare": pycurl_bare(receiver.url),
            "Transport.post (ours)": transport_post(receiver.url),
        }
        for post in ways.values():  # warm: connections open, code paths hot
            cpu_ms_per_post(post, 200)
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(opts.rounds):
            for name, post in ways.items():
                samples[name].append(cpu_ms_per_post(post, opts.requests))
    finally:
        receiver.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"{opts.requests} POSTs per way per round, {opts.rounds} rounds, medians")
    print(f"{'way':24s} {'CPU ms/POST':>12s} {'min':>7s} {'max':>7s}")
    for name, values in samples.items():
        print(f"{name:24s} {medians[name]:12.3f} {min(values):7.3f} {max(values):7.3f}")
    ours = medians["Transport.post (ours)"]
    print(f"ours / requests.Session = {ours / medians['requests.Session']:.2f}")
    print(f"ours / urllib3          = {ours / medians['urllib3 PoolManager']:.2f}")
    print(f"ours / pycurl bare      = {ours / medians['pycurl bare']:.2f}")


if __name__ == "__main__":
    main()
