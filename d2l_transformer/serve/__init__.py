"""Serving a model directory over HTTP: `engine` (the model on one thread, micro-batched), `app`
(the FastAPI app), `run` (``d2l-transformer serve``). Needs the ``serve`` extra."""


class ServeError(ValueError):
    """The server cannot start (the serve extra missing, the port taken, an exact-chapter
    model); one line."""


def run(model_dir, host="127.0.0.1", port=8000, ctx="auto", log_level="info", *,
        allowed_hosts=None, api_key=None, engine="auto", engine_threads=0, compute_type=None):
    """Load `model_dir` and serve it with uvicorn until interrupted. `allowed_hosts`: the
    ``Host`` headers to answer (default: derived from `host`, `middleware.allowed_hosts_for`);
    `api_key`: required of every translation request when set; `engine`: the translation
    engine (``"auto"``, ``"mxnet"`` or ``"ctranslate2"``, `inference.engines`); `engine_threads`,
    `compute_type`: CTranslate2's (0, None: `inference.engines.open_engine`'s defaults)."""
    if api_key is not None and not api_key.strip():
        raise ServeError("the API key is empty")
    try:
        import uvicorn

        from .app import create_app
        from .connection import protocol
        from .middleware import allowed_hosts_for
    except ImportError as e:
        raise ServeError(f"serving needs the serve extra ({e.name} is not installed): "
                         "pip install 'd2l_transformer[serve]'") from None
    import socket

    from .engine import Engine

    try:  # a busy port or an unknown host is one line before the model loads
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind(address)
    except OSError as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    engine = Engine(model_dir, ctx, engine=engine, engine_threads=engine_threads,
                    compute_type=compute_type)
    try:
        hosts = allowed_hosts_for(host, allowed_hosts)
        if engine.choice:
            print(engine.choice, flush=True)
        print(f"serving {engine.model_dir} ({engine.info['engine']} engine) on "
              f"http://{host}:{port}/ (API docs: /docs; Host "
              f"headers answered: {', '.join(hosts)}{'; API key required' if api_key else ''})",
              flush=True)
        uvicorn.run(create_app(engine, allowed_hosts=hosts, api_key=api_key), host=host,
                    port=port, log_level=log_level, http=protocol())
    finally:
        engine.close()
