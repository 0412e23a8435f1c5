"""The model zoo generator (tools/zoo/build.py): tiny random-init transformers models
exported by pnnx, with torch references (fixtures/zoo/)."""
