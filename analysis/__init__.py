"""The analysis of the matrix's run summaries by the registrations' rules: the registered sets, the comparison,
its blocks, H3, H5's path and the review, their statistics and plots. benchmarks/matrix.py writes the summaries;
`python eval.py --matrix` and `--blocks` run the analysis."""
