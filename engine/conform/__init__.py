"""`hisparse conform`: run the installed SGLang's own start-up code on every config of a policy's
domain and compare what it does with what the policy says.

The package never imports SGLang (or torch) at import time: a driver does, inside `hisparse conform`
and its worker processes only."""
