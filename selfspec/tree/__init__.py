"""Trees of draft tokens: their shape (`draft_tree`), which nodes make one (`select`), the masked verify forward
(`forward`), the verifier over a tree (`verifier`) and moving the accepted path into place in the cache (`cache`)."""
