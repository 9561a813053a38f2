"""Sample-quality metrics in the ADM convention: FID, sFID, Inception Score, precision/recall, KID.

The modules, one concept each:

- ``inception``       the TF-FID InceptionV3 network and its TF1 resize
- ``weights``         which weights: file lookup, weights-only loading, SHA-256, official or not, ``test``
- ``calibrated``      the calibrated random network behind ``test``, and structured synthetic images
- ``npz_io``          ADM ``.npz`` batches and image folders, read in chunks, validated
- ``stats_file``      precomputed statistics in an ``.npz`` (ADM reference batches, cache entries), validated
- ``features``        batched feature extraction (pool3, unbiased logits, spatial) with a progress bar
- ``spec``            what a metric declares: features, options, needs, outputs and their direction
- ``fid``             feature statistics and the Frechet distance (FID and sFID)
- ``inception_score`` Inception Score over consecutive splits
- ``prdc``            k-NN precision and recall, block-wise
- ``kid``             Kernel Inception Distance
- ``registry``        every metric by name: a new metric is its own file plus one entry here
- ``stats_cache``     reference features and statistics cached by content hash
- ``reference``       a reference opened, checked and prepared once (precomputed, cache or features)
- ``evaluate``        ``Scorer`` (the library entry point) and ``evaluate``: batches -> result dict
- ``defaults``        the defaults of the extraction, device and cache options
- ``cli``             ``ditbench fid``
"""
