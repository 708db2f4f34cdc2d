"""Data set loaders for the agentic environments, one function per kind of data.

- ``loading.load_rows``: one entry point for Hugging Face data set ids and local JSONL/JSON/Parquet files.
- ``math``: DeepScaleR-style training sets and AIME/AMC/MATH-500-style evaluation sets (problem, answer).
- ``qa``: HotpotQA, 2WikiMultiHopQA and Search-R1/FlashRAG-style QA rows, and the bundled demo set.
- ``demo/``: a small corpus and two-hop questions written for this project (package data).
"""
