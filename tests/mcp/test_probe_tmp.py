import mcp
def test_x():
    print(mcp.__file__, __name__)
    assert hasattr(mcp, "Client")
