"""What a compiled graph is: the callables minicomp hands AOTAutograd and Dynamo, one kind per file,
all sharing one call protocol (``base.GraphCallable``).

    base.py          the protocol: boxed call, last-call fast path, whole-graph fallback, CUDA-graph
                     wrap, a name and notes given at construction
    compiled.py      ``CompiledGraph``: an aten FX graph compiled per input signature (lowering, the
                     pass pipeline, codegen, loading)
    dynamic.py       ``DynamicGraph``: a graph with symbolic sizes, split into parts compiled once
                     (static sizes) and ``SizedPart``s compiled for sizes that recur
    frozen.py        ``FrozenGraph``: inference with parameters frozen into constants (``freeze=True``)
    cached.py        ``CachedGraph``: a graph loaded whole from the on-disk graph cache

and what they are built from: ``options.py`` (``Options``, the modes, the default pass pipeline),
``assemble.py`` (a scheduled graph to generated source and back to a callable), ``signatures.py``
(what a specialization is keyed by), ``cache_entry.py`` (a graph-cache entry as checked JSON) and
``validation.py`` (translation validation). ``minicomp.compile`` and the Dynamo backend
(``minicomp/backend.py``) are the doors in.
"""
