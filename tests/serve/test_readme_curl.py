"""The README's ``grammarspec serve &`` + ``curl`` snippet, run as its users run it, against a real server process.

The snippet is read from README.md's "Serving" section, so a change to it is tested as written.
``grammarspec serve`` without arguments serves the embedded SmolLM2-135M on 127.0.0.1:8000; the test
starts that server (``serve_process``) on a free port and points only the curl command's address at
it.  The curl command runs through ``sh``, quoting and all.  Where ``curl`` is not installed
(``shutil.which("curl")`` finds none) the same request goes out through ``urllib`` alone: the URL,
headers and exact JSON body the shell would hand curl (``readme_curl``), so the check still runs.
Where curl is installed both run, and greedy decoding must give them the same answer.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammarspec.cli.main import DEFAULT_MODEL
from tests.readme_curl import curl_arguments, runners
from tests.serve_process import MODEL, readme_block, serve_process

pytestmark = pytest.mark.slow

README_ADDRESS = "127.0.0.1:8000"  # where `grammarspec serve` listens by default, as the snippet's curl says


@pytest.fixture(scope="module")
def server():
    with serve_process() as (url, _pid):  # `grammarspec serve`'s defaults, on a free port
        yield url


def test_readme_serve_and_curl_snippet(server):
    server_line, curl = readme_block("## Serving", "grammarspec serve &", language="").strip().split("\n", 1)
    # the test's server is the one the snippet's line starts: no arguments, the default model
    assert server_line == "grammarspec serve &" and DEFAULT_MODEL == MODEL
    assert curl.count(README_ADDRESS) == 1
    curl = curl.replace(README_ADDRESS, server.removeprefix("http://"))
    request = json.loads(curl_arguments(curl)[2] or "null")
    schema = request["response_format"]["json_schema"]["schema"]

    contents = []
    for run in runners():
        status, text = run(curl)
        assert status == 200, (run.__name__, text)
        reply = json.loads(text)
        assert reply["object"] == "chat.completion" and reply["model"] == request["model"]
        (choice,) = reply["choices"]
        assert choice["finish_reason"] == "stop", run.__name__  # the grammar closed the object within max_tokens
        assert choice["message"]["role"] == "assistant" and not choice["message"].get("tool_calls")
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        assert 0 < reply["usage"]["completion_tokens"] <= request["max_tokens"]
        contents.append(choice["message"]["content"])
    assert len(set(contents)) == 1  # greedy: curl and the stand-in sent the same request
