"""After a study: promote the best trial (selection, a pure gate, the registry writer), the serving
model with its preprocessing, ONNX/TorchScript export, and `hpolab predict`."""
