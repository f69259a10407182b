"""The hand-derived training step of the attention models (the hot path, shared prompts).

:class:`AttentionStep` is mixed into :class:`iclnb.engine.models._Attention`: it overrides
``loss_and_grad`` with the loss and gradient derived by hand (equal to autograd on
``member_losses(predict(Z, xq), yq).sum()``; ``tests/test_models.py`` checks it for every
attention model against autograd and a naive model in float64), for the shared prompt stream
(each member on its own prompts goes to autograd). The speed tricks of the engine live here
and nowhere else: the softmax step's one pass over the scores and values in reused buffers
(raw exp2 weights on the CPU, with a range check and a shifted fallback), the transposed token
sums (:func:`token_sum`), every head's u and OV rows from one product (``_projections``, which
the folded forward uses too), the weights' views and the step's constants made once, small
tensors laid out (B, D, Ht), and inference mode. ``benchmarks/README.md`` has the numbers.

The mixin reads from the model: ``d``, ``D``, ``T``, ``Ht``, ``flat`` and ``params``, the
forward in folded form (``_heads``, ``_kernel``), ``_sum_heads`` and ``_spread``, and the
kernel's flags ``exp_kernel`` (softmax: the one-pass step) and ``centred``.
"""

from __future__ import annotations

import math

import torch


def token_sum(A, Zt):
    """sum_i A_i z_i (B,R,D) for weights A (B,R,n) (R rows: heads) and tokens Zt = Z^T (B,D,n), as
    the transposed product Z^T A^T (a view): on the CPU (MKL) this orientation runs faster than
    A @ Z for these shapes (a handful of output columns), the same numbers up to float rounding."""
    return torch.bmm(Zt, A.transpose(1, 2)).transpose(1, 2)


class AttentionStep:
    """The hand-derived loss and gradient of a one-layer attention ensemble (a mixin: see the
    module docstring for what it reads from the model)."""

    def _const(self, value: float, like):
        """``value`` as a 0-dim tensor on ``like``'s device and dtype, made once: an op with a Python
        number wraps it in a fresh tensor every call, an op with this one
        does not (the same bits: the number is rounded to the dtype either way)."""
        cache = self.__dict__.setdefault("_const_cache", {})
        key = (value, like.device, like.dtype)
        c = cache.get(key)
        if c is None:
            with torch.inference_mode(False):  # a normal tensor, even when first made in the step:
                # autograd (predict with gradients) may later save it for its backward
                c = cache[key] = torch.full((), value, device=like.device, dtype=like.dtype)
        return c

    def _blocks(self, t):
        """(W_Q, W_K, W_V, W_O, W_Q[:, :, :d], W_O^T, W_K^T) views of ``t`` (``flat`` or its gradient)
        outside autograd, made once per buffer (the step would otherwise re-make them every call)."""
        if torch.is_grad_enabled():
            return self._block_views(t)
        cache = self.__dict__.setdefault("_block_cache", {})
        views = cache.get(id(t))
        # still views of t's current storage (not of a buffer since replaced, nor copies)
        if views is None or views[0]._base is not t or views[0].data_ptr() != t.data_ptr():
            if len(cache) > 4:
                cache.clear()
            with torch.no_grad():
                views = cache[id(t)] = self._block_views(t)
        return views

    def _block_views(self, t):
        WQ, WK, WV, WO = self.params(t).values()
        return WQ, WK, WV, WO, WQ[:, :, : self.d], WO.transpose(1, 2), WK.transpose(1, 2)

    def _projections(self, xq):
        """U (B,Ht(1+T),D): every head's u = KQ z_q (times ``score_unit``), then its T rows of OV^T,
        for each prompt, and OV (Ht,T,D). The u rows are one product x_q KQx^T (KQx read
        transposed, no copy), the OV rows the same for every prompt (a broadcast)."""
        WQ, WK, WV, WO, WQd, _, WKt = self._blocks(self.flat)
        B, Ht, D, d, T = xq.shape[0], self.Ht, self.D, self.d, self.T
        KQx = torch.bmm(WKt, WQd).mul_(self._const(self.score_unit / math.sqrt(D), xq))  # (Ht,D,d)
        OV = torch.bmm(WO, WV)  # (Ht,T,D)
        u = torch.mm(xq, KQx.view(Ht * D, d).t()).view(B, Ht, D)
        return torch.cat([u, OV.view(1, Ht * T, D).expand(B, Ht * T, D)], 1), OV

    # ---- hand-derived gradients (the training hot path, shared prompts) ------------------------
    def loss_and_grad(self, Z, xq, yq, loss_out=None):
        """Per-member batch MSE (K,) and its gradient in ``flat.grad``; equals autograd on
        ``member_losses(predict(Z, xq), yq).sum()`` (tests) at a fraction of its cost. Runs in
        inference mode: its small ops skip autograd's bookkeeping; its
        working buffers (inference tensors) never leave it."""
        if Z.dim() == 4:
            return super().loss_and_grad(Z, xq, yq, loss_out)
        if self.flat.grad is None:
            self.flat.grad = torch.zeros_like(self.flat)
        with torch.inference_mode():
            loss = self._hand_grads(Z, xq, yq, loss_out)
        return loss if loss_out is not None else loss.clone()  # a normal tensor for the caller

    def _hand_grads(self, Z, xq, yq, loss_out):
        B, d, D, Ht, T = xq.shape[0], self.d, self.D, self.Ht, self.T
        if self.exp_kernel:
            loss, dOV, dKQx = self._softmax_grads(Z, xq, yq, loss_out)
            self._chain(dOV, dKQx)
            return loss
        Zt = Z.transpose(1, 2)
        yh, (V, A1, dphi, G1, norm) = self._heads(Zt, xq)
        # gn = dL/dyh per head, up to the factor 2/(B T) (applied on the small tensors at the end),
        # times norm. With p_i = phi(s_i) / sum phi and w_i = sum_t gn_t v_ti, c = sum_t gn_t yh_t:
        #   centred kernels: dL/ds_i = phi'(s_i) (w_i - c);  linear: dL/ds_i = w_i (phi' = 1, no c).
        # _kernel gives phi' (dphi; None for phi' = 1; softmax took its own pass above). One output
        # (T = 1) takes plain elementwise forms: tiny matrix products cost more than they compute.
        if T == 1:  # gn is one number per head: scale after the product (as for the centring)
            err = self._sum_heads(yh[..., 0]) - yq.view(B, 1)  # (B,K)
            loss = torch.mean(err.square(), 0, out=loss_out)
            gn = self._spread(err).unsqueeze(-1) * norm  # (B,Ht,1)
            A2 = V[:, :, 0] if dphi is None else V[:, :, 0] * dphi
            G2 = token_sum(A2, Zt)  # (B,Ht,D)
            if self.centred:
                G2 = G2 - token_sum(dphi, Zt) * yh
            G2 = G2.mul_(gn)  # dL/du up to the constant factor
        else:
            loss, gn = self._outputs_loss(yh, yq, norm, loss_out)  # gn (B,Ht,T)
            A2 = torch.mul(V[:, :, 0], gn[..., :1])  # w_i = sum_t gn_t v_ti (B,Ht,n), one output at a time:
            for t in range(1, T):  # no (B,Ht,T,n) temporary (faster at chapter 6's two outputs)
                A2 += V[:, :, t] * gn[..., t : t + 1]
            if dphi is not None:
                A2 = A2.mul_(dphi)
            G2 = token_sum(A2, Zt)  # (B,Ht,D): dL/du up to the constant factor
            if self.centred:
                G2 = G2 - token_sum(dphi, Zt) * (gn * yh).sum(2, keepdim=True)
        # dL/dP for P = W_O W_V = OV^T, (Ht,T,D)
        dOV = ((G1 * gn).sum(0).unsqueeze(1) if T == 1
               else torch.einsum("bhd,bht->htd", G1, gn)).mul_(2 / (B * T))
        # u = KQx x_q with KQx = W_K^T W_Q[:, :, :d] / sqrt(D): chain into W_Q and W_K
        dKQx = (xq.T @ G2.reshape(B, Ht * D)).view(d, Ht, D).permute(1, 2, 0).mul(2 / (B * T * math.sqrt(D)))
        self._chain(dOV, dKQx)
        return loss

    def _chain(self, dOV, dKQx):
        """Chain dL/dP (P = W_O W_V, (Ht,T,D)) and dL/dKQx (Ht,D,d) into the weights' gradients."""
        gQ, gK, gV, gO, gQd, _, _ = self._blocks(self.flat.grad)
        WQ, WK, WV, WO, WQd, WOt, _ = self._blocks(self.flat)
        torch.bmm(WQd, dKQx.transpose(1, 2), out=gK)
        gQd.copy_(torch.bmm(WK, dKQx))  # the last T columns of W_Q meet z_q's zeros: no gradient
        if self.T == 1:
            torch.mul(WOt, dOV, out=gV)
            gO.copy_(torch.bmm(WV, dOV.transpose(1, 2)).transpose(1, 2))
        else:
            torch.bmm(WOt, dOV, out=gV)
            torch.bmm(dOV, WV.transpose(1, 2), out=gO)

    # below 2^-90 or above 2^90 a sum of raw exp2 weights is redone with the row maximum subtracted
    _RAW_RANGE = (2.0**-90, 2.0**90)
    # the raw-exp2 path's range check reads two numbers on the host: harmless on the CPU, never
    # used on CUDA (a graph cannot capture it); False takes the shifted path everywhere
    raw_exp2 = True

    def _step_buffers(self, Z):
        """The softmax step's working buffers, reused while the batch shape stays: the tokens with
        a column of ones Z1 (B,n,D+1), the scores and values W (B,(1+T)Ht,n) (then E and E v, in
        place; rows: every head's score, then its T value rows) and the token sums G
        (B,D+1,(1+T)Ht), with their views made once. Reuse saves the allocations, the ones
        column's fill and the view ops of every step; on CUDA they are the static buffers a captured
        graph reads and writes."""
        B, n, D = Z.shape
        Ht, T, key = self.Ht, self.T, (B, n, Z.device, Z.dtype)
        buf = self.__dict__.get("_step_buf")
        if buf is None or buf["key"] != key:
            Z1 = Z.new_empty(B, n, D + 1)
            Z1[..., D] = 1.0
            R = (1 + T) * Ht
            W, G = Z.new_empty(B, R, n), Z.new_empty(B, D + 1, R)
            Z1t = Z1.transpose(1, 2)
            buf = self.__dict__["_step_buf"] = {
                "key": key, "Z": Z1[..., :D], "Z1t": Z1t, "Zt": Z1t[:, :D], "W": W, "Wt": W.transpose(1, 2),
                "E": W[:, :Ht], "G": G, "G1": G[:, :D, :Ht], "G2": G[:, :D, Ht:],
                "total": G[:, D, :Ht], "ysum": G[:, D, Ht:]}
            # per output t: the value rows E v_t (B,Ht,n) and their token sums (B,D,Ht)
            EVt, G2t = W[:, Ht:].view(B, Ht, T, n), G[:, :D, Ht:].view(B, D, Ht, T)
            buf.update(EVs=[EVt[:, :, t] for t in range(T)], G2s=[G2t[..., t] for t in range(T)],
                       ysumt=G[:, D, Ht:].view(B, Ht, T))
        return buf

    def _softmax_sums(self, Z, xq):
        """The softmax step's one pass over (B,(1+T)Ht,n): the weights E_i and E_i v_ti overwrite
        the scores and values they come from (one buffer W), and one product of W with the tokens
        and a row of ones gives sum_i E_i z_i, sum_i E_i v_ti z_i and the sums sum_i E_i (the
        normaliser) and sum_i E_i v_ti (the head outputs): the step buffers, filled.

        On the CPU the weights are exp2 of the raw scores (no pass for the row maximum) unless
        a sum falls outside ``_RAW_RANGE`` (then E is recomputed shifted by the row maximum,
        as on other devices, where the check would cost a synchronisation)."""
        U, _ = self._projections(xq)  # (B,(1+T)Ht,D): [u_h; OV_h rows]
        buf = self._step_buffers(Z)
        buf["Z"].copy_(Z)
        W, E, G, total = buf["W"], buf["E"], buf["G"], buf["total"]
        raw = self.raw_exp2 and Z.device.type == "cpu"
        while True:
            torch.bmm(U, buf["Zt"], out=W)  # scores (log2 units) and values (B,(1+T)Ht,n), then in place:
            if raw:  # the weights E and E v
                E.exp2_()
            else:
                E.sub_(E.amax(-1, keepdim=True)).exp2_()
            for EV in buf["EVs"]:  # one output at a time (a broadcast over the outputs' axis is slower)
                EV.mul_(E)
            torch.bmm(buf["Z1t"], buf["Wt"], out=G)  # (B,D+1,(1+T)Ht); total: sum_i E_i
            if not raw:
                return buf
            lo, hi = torch.aminmax(total)
            if self._RAW_RANGE[0] <= float(lo) and float(hi) <= self._RAW_RANGE[1]:
                return buf
            raw = False

    def _softmax_grads(self, Z, xq, yq, loss_out):
        """Loss, dL/dP and dL/dKQx of softmax heads from the sums of one pass
        (:meth:`_softmax_sums`); small tensors are laid out (B, D, Ht) throughout. With T outputs
        the gradient of the scores' side is sum_t gn_t (sum_i E_i v_ti z_i - yh_t sum_i E_i z_i):
        the per-output sums come from the same product, so no second pass over (B,Ht,n)."""
        B, D = Z.shape[0], self.D
        buf = self._softmax_sums(Z, xq)
        G1, total = buf["G1"], buf["total"]  # (B,D,Ht): sum_i E_i z_i; (B,Ht): sum_i E_i
        norm = total.reciprocal()  # (B,Ht)
        if self.T > 1:
            return self._softmax_grads_outputs(buf, xq, yq, loss_out, norm)
        G2 = buf["G2"]  # (B,D,Ht): sum_i E_i v_i z_i
        yh = buf["ysum"] * norm  # head outputs
        err = self._sum_heads(yh) - yq.view(B, 1)  # (B,K)
        loss = err.square().mean(0)  # (mean with out= costs more than mean and copy_)
        loss = loss if loss_out is None else loss_out.copy_(loss)
        gn = torch.mul(self._spread(err), norm).unsqueeze(1)  # (B,1,Ht): dL/dyh (up to 2/B) times norm
        # dL/du up to 2/B: sum_i p_i (v_i - yh) z_i gn = (G2 - yh G1) gn
        gU = torch.addcmul(G2, G1, yh.unsqueeze(1), value=-1).mul_(gn)  # (B,D,Ht)
        dOV = (G1 * gn).sum(0).T.unsqueeze(1).mul_(self._const(2 / B, xq))  # (Ht,1,D)
        return loss, dOV, self._dKQx(xq, gU, 2 / (B * math.sqrt(D)))

    def _softmax_grads_outputs(self, buf, xq, yq, loss_out, norm):
        """The tail of :meth:`_softmax_grads` for T > 1 outputs (chapter 6's two-output heads)."""
        B, D, T = xq.shape[0], self.D, self.T
        norm = norm.unsqueeze(-1)  # (B,Ht,1)
        yh = buf["ysumt"] * norm  # (B,Ht,T) head outputs
        loss, gn = self._outputs_loss(yh, yq, norm, loss_out)
        # dL/du up to 2/(B T): sum_t gn_t (G2_t - yh_t G1), G2_t = sum_i E_i v_ti z_i; one output at
        # a time (a reduction over the short outputs' axis, or an einsum, is slower)
        G1, G2s, gns = buf["G1"], buf["G2s"], gn.unsqueeze(1).unbind(-1)  # gns[t]: (B,1,Ht)
        gU = torch.mul(G2s[0], gns[0])  # (B,D,Ht)
        for t in range(1, T):
            gU.addcmul_(G2s[t], gns[t])
        gU.addcmul_(G1, (gn * yh).sum(-1).unsqueeze(1), value=-1)
        dOV = torch.stack([(G1 * g).sum(0) for g in gns]).permute(2, 0, 1)  # (Ht,T,D)
        dOV = dOV.mul_(self._const(2 / (B * T), xq))
        return loss, dOV, self._dKQx(xq, gU, 2 / (B * T * math.sqrt(D)))

    def _outputs_loss(self, yh, yq, norm, loss_out):
        """T > 1 outputs: the member losses (K,) (written into ``loss_out`` when given) and gn,
        dL/dyh (up to 2/(B T)) times ``norm`` (B,Ht,1), from head outputs yh (B,Ht,T) and yq (B,T)."""
        B, T = yh.shape[0], self.T
        err = self._sum_heads(yh) - yq.view(B, 1, T)  # (B,K,T)
        loss = err.square().mean((0, 2))
        loss = loss if loss_out is None else loss_out.copy_(loss)
        return loss, self._spread(err) * norm

    def _dKQx(self, xq, gU, scale: float):
        """dL/dKQx (Ht,D,d) from dL/du laid out (B,D,Ht), times ``scale``: u = KQx x_q."""
        B, d, D, Ht = xq.shape[0], self.d, self.D, self.Ht
        return (xq.T @ gU.view(B, D * Ht)).view(d, D, Ht).permute(2, 1, 0).mul_(self._const(scale, xq))
