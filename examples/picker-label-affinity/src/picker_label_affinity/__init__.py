"""Example picker plugins, registered as ``label-affinity-scorer`` and ``tpot-trend-scorer``."""

from picker_label_affinity.affinity import LabelAffinityParams, LabelAffinityScorer
from picker_label_affinity.tpot import TpotTrendParams, TpotTrendScorer

__all__ = ["LabelAffinityParams", "LabelAffinityScorer", "TpotTrendParams", "TpotTrendScorer"]
