"""ReDrafter: the recurrent draft head and its dynamic tree (``head``) and the registered ``redrafter``
decoder (``decoder``)."""
