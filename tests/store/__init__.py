"""The store: the fold against its reference, the semantics, the life cycle, the servers."""
