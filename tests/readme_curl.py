"""A README ``curl`` command run as its users run it, and a urllib stand-in where curl is not installed (test helper).

The shell reads the command line: ``sh`` runs curl itself, and for the stand-in ``sh`` prints the
arguments it would pass to curl (quoting removed, variables such as ``$M`` expanded from ``env``),
which urllib then sends.  Only the options the README's commands use are known to the stand-in;
another one fails the test rather than send a different request.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable

TIMEOUT = 300.0


def curl_arguments(curl: str, env: dict[str, str] | None = None) -> tuple[str, dict[str, str], str | None]:
    """``(url, headers, body)`` of a ``curl ...`` command line, from the words the shell passes to curl."""
    assert curl.startswith("curl "), curl
    printed = subprocess.run(
        ["sh", "-c", "printf '%s\\0' " + curl.removeprefix("curl ")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    words = iter(printed.split("\0")[:-1])
    url, headers, body = None, {}, None
    for word in words:
        if word == "-s":  # silent: no progress meter, the same request
            continue
        if word == "-H":
            name, value = next(words).split(":", 1)
            headers[name] = value.strip()
        elif word == "-d":
            body = next(words)
        else:
            assert not word.startswith("-"), f"the urllib stand-in does not know curl's {word}"
            url = word if "://" in word else "http://" + word  # curl's default scheme
    assert url is not None, curl
    return url, headers, body


def run_curl(curl: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``(status, body)``: the command line run by ``sh``, curl writing the HTTP status after the body."""
    done = subprocess.run(
        ["sh", "-c", curl + " -w '\\n%{http_code}'"], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    body, status = done.stdout.rsplit("\n", 1)
    return int(status), body


def run_urllib(curl: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``(status, body)``: the request the command line sends (a POST with ``-d``, else a GET), through urllib."""
    url, headers, body = curl_arguments(curl, env)
    data = None if body is None else body.encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def runners() -> list[Callable[..., tuple[int, str]]]:
    """curl where it is installed, then always the urllib stand-in (so that it stays checked too)."""
    return ([run_curl] if shutil.which("curl") else []) + [run_urllib]
