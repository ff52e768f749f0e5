"""The data layer: what a data root holds and how a process reads its documents.

The catalog of a root's datasets and files with their document and token counts
(``catalog``, ``filecounts``, ``metacount``, ``indexing``), the root's ``metadata.json``
(``metadata``) and what it fills in a config (``rootconfig``), the format handler a config
asks for (``dataformat``), per-worker access to a dataset's files (``access``), the check of
delimiters already stored in documents (``delimiters``), and generated corpora for tests
and benchmarks (``synthetic``). The bundled tokenizer (``stdlib-bpe-4k.json``) lies here too.
"""
