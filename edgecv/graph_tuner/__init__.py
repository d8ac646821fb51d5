"""The graph tuner: a data layout per convolution, chosen by dynamic programming over
measured kernel and layout-transform times.

- :mod:`.graph`: the layout graph and Relax's layout rules, in plain Python;
- :mod:`.solver`: exact DP over the graph (states carry every live branch's layout),
  iterated greedy when the states explode.
"""
