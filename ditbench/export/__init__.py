"""`ditbench export`: result records into experiment trackers (TensorBoard, MLflow), each an extra."""
