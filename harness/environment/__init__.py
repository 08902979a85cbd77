"""What a measurement ran on: the static facts (`static_facts`: versions, driver, GPU properties), the measured
environment a verdict records (`measured`: the GPU's performance model), and the report `python -m harness env`
prints (`report`)."""
