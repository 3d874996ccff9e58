"""Request control: parse → admit → schedule → account, one request at a time (the "director")."""
