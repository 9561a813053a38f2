"""Files in and out: YAML, safe opens and atomic writes, output folders and their lock, images, weights."""
