"""Retrieval: embeddings, chunking, background ingestion and hybrid search for vector stores.

Imports ``store`` and ``protocol`` only (docs/file-search.md).
"""
