"""Do two contenders compute the same thing?  Loss and one gradient of jitgraph against
each reference, within a tolerance of the reference's largest magnitude."""
import numpy as np

TOL = 1e-3                  # max|diff| / max|reference|, fit for float32 over deep chains


def agree(got, ref, tol=TOL):
    """Does ``got`` match ``ref`` within ``tol`` of ref's largest magnitude?"""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) / scale if scale > 0 else float("inf")
    finite = bool(np.all(np.isfinite(got)) and np.all(np.isfinite(ref)))
    return {"ok": finite and diff <= tol, "max_diff_over_scale": diff, "scale": scale}


def agreement(jg_loss, jg_grad, refs, grad_of, tol=TOL):
    """Loss and one gradient of jitgraph against each reference {name: (loss, grad)}."""
    out = {"tolerance": tol, "grad_of": grad_of}
    for name, (loss, grad) in refs.items():
        a, b = agree(jg_loss, loss, tol), agree(jg_grad, grad, tol)
        out[name] = {"ok": a["ok"] and b["ok"], "loss": a, "grad": b,
                     "loss_values": [float(jg_loss), float(loss)]}
    return out


def md_agreement(a):
    parts = []
    for name in ("numpy", "torch"):
        r = a.get(name)
        if r is not None:
            parts.append(f"{name}: {'yes' if r['ok'] else 'NO'} (loss {r['loss']['max_diff_over_scale']:.1e}, "
                         f"{a['grad_of']} grad {r['grad']['max_diff_over_scale']:.1e})")
    return (f"Agreement with jitgraph (loss and the {a['grad_of']} gradient, max|diff| / max|ref| <= "
            f"{a['tolerance']:g}): " + "; ".join(parts or ["no reference ran"]) + ".")
