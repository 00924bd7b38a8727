"""Grain's private module paths that real client code imports, mapped onto loader.

Porting by import line turns `from grain._src.python.X import Y` into
`from loader._src.python.X import Y`. These modules give the names such
clients use (MaxText's input pipeline subclasses Grain's TFRecord reader;
others import `dataset` or `data_loader` for type hints), as the very objects
loader's public API exports. Nothing in loader imports this package.
"""
