"""``grammarspec serve``: an OpenAI-compatible server (Chat Completions) over one continuous-batching loop.

:class:`Engine` owns the model and the decode loop; :func:`create_app` is the
Starlette app; :func:`serve` runs it with uvicorn.  Needs the ``serve`` extra
(``pip install 'grammarspec[serve]'``: starlette, uvicorn).
"""

from grammarspec.serve.engine import Engine, prompt_ids
from grammarspec.serve.prefix import PrefixCache
from grammarspec.serve.protocol import ChatRequest, RequestError, parse_request

__all__ = ["Engine", "PrefixCache", "ChatRequest", "RequestError", "parse_request", "prompt_ids", "create_app", "serve"]


def __getattr__(name: str):  # the HTTP side imports starlette: only when asked for
    if name in ("create_app", "serve"):
        from grammarspec.serve import app

        return getattr(app, name)
    raise AttributeError(name)
