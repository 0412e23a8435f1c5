"""Minimal pnnx -> ncnn bug repros: the export helper (`pnnx_export`) and the catalogue of
minimal models with their workarounds (`cases`). torch is only imported when a model is
built or exported, so listing the catalogue works without it."""
