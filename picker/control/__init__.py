"""Request control: parse → admit → schedule → account, one request at a time (the "director")."""

from picker.control.director import Admitter, Director, Resolver, Routed

__all__ = ["Admitter", "Director", "Resolver", "Routed"]
