"""The typed spec: pydantic models of everything a user hands ditbench to run (knobs, cells, suites, the
quality section, cluster options, the plan request), each input validated once into a model."""
