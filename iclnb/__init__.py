"""iclnb: the library behind the executable book on in-context learning in softmax attention.

The chapters (``notebooks/``) tell; this package does, in four layers, each importing only the
ones below it: ``engine`` (samplers, models, the training engine, the run cache), ``analysis``
(circuits, closed-form predictors, shared ensembles), ``chapters`` (what only one chapter uses)
and, importing none of those, ``bookkit`` (claims, the chapter runner, sweeps, the book build).
"""

__version__ = "0.2.0"
