"""Sample-quality metrics in the ADM convention: FID, sFID, Inception Score, precision/recall, KID.

The modules, one concept each:

- ``defaults``        every option's default value, in one place
- ``inception``       the TF-FID InceptionV3 (torch-fidelity's weight file), its TF1 resize, weight lookup
- ``npz_io``          ADM ``.npz`` batches and image folders, read in chunks, validated
- ``features``        batched feature extraction (pool3, unbiased logits, spatial) with a progress bar
- ``fid``             feature statistics and the Frechet distance (FID and sFID)
- ``inception_score`` Inception Score over consecutive splits
- ``prdc``            k-NN precision and recall, block-wise
- ``kid``             Kernel Inception Distance
- ``stats_cache``     reference features and statistics cached by content hash
- ``evaluate``        the whole evaluation: sources -> features -> metrics -> result dict
- ``cli``             ``ditbench fid``
- ``calibrated``      a calibrated random Inception and synthetic images (tests, timing without weights)
"""
