"""Tools around the book rather than in it: the book's execution cache, shared by the book
build and the notebook tests."""
