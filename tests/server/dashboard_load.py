"""A doc-burst-like load for the dashboard tests, and a reader of /dashboard/events."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

DOC_TOKENS = 800  # the timed engine's tokenizer: one token per character


def stream_completion(base_url: str, headers: dict, prompt: str, max_tokens: int,
                      started: threading.Event | None = None) -> int:
    n = 0
    body = {"model": "timed-fake", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", base_url + "/v1/completions", json=body, headers=headers,
                      timeout=60) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                n += 1
                if started is not None and n >= 3:
                    started.set()
    return n


def doc_burst(base_url: str, headers: dict, streams: int = 3, stream_tokens: int = 60,
              doc_tokens: int = DOC_TOKENS, doc_delay_s: float = 0.1) -> None:
    """`streams` chat-like streams decode; once each has a few tokens (their own prompts are
    done), a document of `doc_tokens` arrives."""
    started = [threading.Event() for _ in range(streams)]
    with ThreadPoolExecutor(streams + 1) as pool:
        futures = [pool.submit(stream_completion, base_url, headers, f"stream {i} says hi",
                               stream_tokens, started[i]) for i in range(streams)]
        for event in started:
            event.wait(30)
        time.sleep(doc_delay_s)
        doc = ("lorem ipsum dolor sit amet " * (doc_tokens // 27 + 1))[:doc_tokens]
        futures.append(pool.submit(stream_completion, base_url, headers, doc, 4))
        for f in futures:
            assert f.result() > 0


class EventReader:
    """Reads /dashboard/events in a thread; `messages` holds every decoded SSE message."""

    def __init__(self, base_url: str, headers: dict) -> None:
        self.messages: list[dict] = []
        self._stop = threading.Event()
        self._client: httpx.Client | None = None
        self.status: int | None = None
        self._thread = threading.Thread(target=self._run, args=(base_url, headers), daemon=True)
        self._thread.start()

    def _run(self, base_url: str, headers: dict) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=30))
        try:
            with self._client.stream("GET", base_url + "/dashboard/events",
                                     headers=headers) as resp:
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        self.messages.append(json.loads(line[6:]))
                    if self._stop.is_set():
                        return
        except (httpx.HTTPError, RuntimeError, ValueError):
            if not self._stop.is_set():
                raise

    def events(self, kind: str) -> list[dict]:
        out = []
        for m in self.messages:
            if m["kind"] == "batch":
                out.extend(e for e in m["events"] if e["kind"] == kind)
            elif m["kind"] == "snapshot" and kind in ("step", "stall"):
                out.extend(m[kind + "s"])
        return out

    def wait_for(self, predicate, timeout_s: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._client.close()  # unblocks the reader: the connection goes away
        self._thread.join(timeout=5)
