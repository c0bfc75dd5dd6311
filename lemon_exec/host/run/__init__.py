"""The runner: every call in (facade or session owner), per-call or session, and the result out."""
