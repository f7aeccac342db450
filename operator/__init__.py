"""inturn operator: kopf handlers over pure manifest builders for the Destination resource."""
