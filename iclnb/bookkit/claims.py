"""What a chapter imports to record its claims: the claims ledger (:mod:`iclnb.bookkit.ledger`)
with its page, the claims table at the end of the chapter and the verdict box that ends each
section (:mod:`iclnb.bookkit.scorecard`, :mod:`iclnb.bookkit.verdicts`).

In a chapter::

    from iclnb.bookkit.claims import Claims
    claims = Claims("02_kernel_regressor_view", enforce=enforce_claims)  # reads the claim spec
    claims.measure("closer-debiased", err_dgd, rival=err_gd, se=se_diff)
    claims.box("closer-debiased", how="why this rival")  # the section's verdict box
    ...
    claims.finish()  # the last cell: the claims table; raises if enforced and a claim failed
"""

from __future__ import annotations

from IPython.display import display

from iclnb.bookkit import ledger
from iclnb.bookkit.scorecard import ClaimsTable
from iclnb.bookkit.verdicts import VerdictBox


class Claims(ledger.Claims):
    """The claims of one chapter (:class:`iclnb.bookkit.ledger.Claims`), shown on its page."""

    def box(self, cid: str, how: str = "") -> VerdictBox:
        """The verdict box of claim ``cid`` (measured already), for the end of its section;
        ``how``: a sentence on the methodology for its collapsed block (why this rival, where the
        threshold came from)."""
        rows = {r["id"]: r for r in self.to_dict()["claims"]}
        if cid not in rows:
            raise ValueError(f"claim {cid!r} has not been measured yet in {self.chapter}")
        return VerdictBox(rows[cid], chapter=self.chapter, how=how)

    def table(self) -> ClaimsTable:
        """The claims table for display."""
        return ClaimsTable(self.to_dict()["claims"], enforced=self.enforce, chapter=self.chapter)

    def finish(self) -> ClaimsTable:
        """Write the JSON and return the table for display; raise
        :class:`iclnb.bookkit.ledger.ClaimsFailed` if enforced and a claim failed (the table shown first)."""
        super().finish(show=lambda: display(self.table()))
        return self.table()
