"""Retrieval: embeddings, chunking, background ingestion and hybrid search for vector stores.

Imports ``store``, ``protocol`` and the package-root ``documents`` only (docs/file-search.md).
"""
