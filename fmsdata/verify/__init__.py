"""``fmsdata verify``: a pipeline run unbroken against saved, resumed and rescaled runs
(``runs``), and the stage whose state did not carry a difference named (``blame``)."""
