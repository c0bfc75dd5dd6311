"""The run router: one call in, per-call or session, and the result out."""
