"""iclnb: the library behind the executable book on in-context learning in softmax attention.

The chapters (``notebooks/``) tell; this package does: samplers, models, the training engine,
circuit extraction, closed-form predictors, chapter 1's softmax-regression objects, claims and
the chapter runner.
"""

__version__ = "0.2.0"
