"""For the notebooks and the report: claims and set-up (:mod:`~kit.lab.notebook`), figures (:mod:`~kit.lab.plots`,
:mod:`~kit.lab.payoff_plots`), notebook 05's sentences about the recorded rows (:mod:`~kit.lab.payoff_text`) and the
HTML report (:mod:`~kit.lab.report`).

May import every layer but :mod:`kit.cli`.
"""
