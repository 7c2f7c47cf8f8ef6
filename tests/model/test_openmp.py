"""One OpenMP pool per process: a thread done with torch gives its workers back."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from grammarspec.model.openmp import release_thread_pool

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_work() -> None:
    a = torch.ones((512, 512))
    for _ in range(3):
        a = (a @ a) / 512  # large enough for torch to split across its OpenMP threads


def test_a_thread_that_released_its_pool_holds_no_workers_and_gets_them_back_on_demand():
    """Counted in OS threads: a worker thread's pool (as the server's main thread holds after loading the model)
    is freed by the release, and a later parallel region there starts one again."""
    counts = {}
    threads = torch.get_num_threads()  # one under the suite's workers: this test's thread asks for two

    def worker():
        torch.set_num_threads(2)
        counts["before"] = _threads()
        _parallel_work()
        counts["with pool"] = _threads()
        counts["released"] = release_thread_pool()
        counts["after"] = _threads()
        _parallel_work()
        counts["again"] = _threads()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    torch.set_num_threads(threads)
    assert counts["with pool"] > counts["before"]  # this thread's workers
    assert counts["released"] is True
    assert counts["after"] < counts["with pool"]
    assert counts["again"] > counts["after"]


def test_the_engine_releases_the_constructing_thread_s_pool(monkeypatch):
    from grammarspec.serve import engine as engine_module
    from tests.toy_models import tiny_llama

    calls = []
    monkeypatch.setattr(engine_module, "release_thread_pool", lambda: calls.append(threading.current_thread()))
    model = tiny_llama(64, seed=1)

    class Tokenizer:
        eos_token_id = 0
        chat_template = None

    engine = engine_module.Engine(model, Tokenizer(), max_batch_size=2)
    engine.close()
    assert calls == [threading.current_thread()]
