import importlib, os, sys
_here = os.path.dirname(os.path.abspath(__file__))
if __name__ == "mcp":
    _tests = os.path.dirname(_here)
    del sys.modules["mcp"]
    _saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _tests]
    try:
        _sdk = importlib.import_module("mcp")
    finally:
        sys.path[:] = _saved
    if _here not in _sdk.__path__:
        _sdk.__path__.append(_here)
    sys.modules["mcp"] = _sdk
