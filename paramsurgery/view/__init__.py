"""Pictures of graphs: `paramsurgery view`, `diff --html`, `--report` and `compare --html`."""
