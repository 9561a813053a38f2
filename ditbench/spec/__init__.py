"""The typed spec: pydantic models of everything a user hands ditbench to run (knobs, cells, suites,
the quality section, cluster options, the plan request), each input validated once into a model.

base: the model base class, the field types and the numeric-string rule; knobs: `Knobs`; cell:
`CellSpec` and cell ids; quality: the `quality:` section; suite: suite files and their expansion;
overrides: `key=value` on the command line; cluster: `cluster:` options; plan: the plan request.
"""
