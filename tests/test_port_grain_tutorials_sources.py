"""Grain's PyTorch and Hugging Face data-source tutorials, on Grain and on loader.

Sources (github.com/google/grain): docs/tutorials/data_sources/pytorch_dataset_tutorial.md
and huggingface_dataset_tutorial.md. Their Grain cells are kept as written; the
downloads (torchvision's FashionMNIST, `load_dataset("lhoestq/demo1")`, a BERT
tokenizer) and torch itself are replaced by small local stand-ins with the same
access protocol (`__len__`, `__getitem__` returning a fresh tuple or dict), and
`torch.stack` by `np.stack`. Both tutorials pass a foreign dataset straight to
`MapDataset.source`, filter and map it, and batch it with a `batch_fn`.
"""

from __future__ import annotations

from tests import porting
from tests.porting import plain, structure

# ---- docs/tutorials/data_sources/pytorch_dataset_tutorial.md ---------------

PYTORCH_TUTORIAL = """
import grain
import numpy as np


class FashionMNISTStandIn:  # torchvision.datasets.FashionMNIST: (image, label) pairs.

  def __init__(self, n):
    rng = np.random.default_rng(0)
    self.data = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    self.targets = rng.integers(0, 10, n)

  def __len__(self):
    return len(self.data)

  def __getitem__(self, index):
    return self.data[index], int(self.targets[index])


def to_tensor(image):  # torchvision.transforms.ToTensor: CHW float in [0, 1].
  return (image.astype(np.float32) / 255.0)[None]


fashion_mnist = FashionMNISTStandIn(200)


class ToTensorAndOneHot(grain.transforms.Map):
  to_tensor = staticmethod(to_tensor)

  def map(self, element):
    data = self.to_tensor(element[0])
    target = np.zeros(10, dtype=np.float32)
    target[element[1]] = 1
    return (data, target)


class KeepShoesOnly(grain.transforms.Filter):
  shoes_only = {5, 7, 9}  # Sandal, Sneaker, Ankle boot

  def filter(self, element):
    return element[1] in self.shoes_only


dataset = (
    grain.MapDataset.source(fashion_mnist)
    .shuffle(seed=42)
    .filter(KeepShoesOnly())  # leave only shoes
    .map(ToTensorAndOneHot())  # construct tensors and label one-hot encoding
    .to_iter_dataset()
    .batch(  # batches consecutive elements
        batch_size=5,
        batch_fn=lambda ts: tuple(np.stack(t) for t in zip(*ts)),
    )
)
iterator = iter(dataset)
batch_0 = next(iterator)
all_batches = [batch_0, *iterator]
"""


def test_pytorch_dataset_tutorial():
  g, l = porting.run_both(PYTORCH_TUTORIAL)
  assert type(l.batch_0) is type(g.batch_0) is tuple
  assert structure(l.batch_0) == structure(g.batch_0) == [((5, 1, 28, 28), "float32"), ((5, 10), "float32")]
  assert plain(l.all_batches) == plain(g.all_batches)
  assert {int(t.argmax()) for b in l.all_batches for t in b[1]} <= {5, 7, 9}


# ---- docs/tutorials/data_sources/huggingface_dataset_tutorial.md -----------

HUGGINGFACE_TUTORIAL = """
from dateutil.parser import parse
import grain
import numpy as np


class DemoStandIn:  # load_dataset("lhoestq/demo1")["train"]: a fresh dict per access.

  def __init__(self, n):
    self._rows = [{"id": str(i), "package_name": f"com.app{i % 7}",
                   "review": " ".join(["great", "app", "but", "slow"][: 1 + i % 4] * (1 + i % 5)),
                   "date": f"2019-{1 + i % 12:02d}-{1 + i % 28:02d} 10:{i % 60:02d}:00",
                   "star": 1 + i % 5, "version_id": 1000 + i} for i in range(n)]

  def __len__(self):
    return len(self._rows)

  def __getitem__(self, index):
    return dict(self._rows[index])


class TokenizerStandIn:  # AutoTokenizer.from_pretrained("bert-base-uncased"): [CLS] ids [SEP].

  def __call__(self, text):
    return {"input_ids": [101, *(1000 + sum(map(ord, w)) for w in text.split()), 102]}


hf_train = DemoStandIn(40)
tokenizer = TokenizerStandIn()


def process_date(sample: dict) -> dict:
  sample["date"] = parse(sample["date"]).timestamp()
  return sample


def process_sample_to_np(sample: dict) -> np.ndarray:
  for name, value in sample.items():
    sample[name] = np.asarray(value)
  return sample


dataset = (
    grain.MapDataset.source(hf_train)
    .shuffle(seed=42)  # shuffles globally
    .map(process_date)  # maps each element
    .map(process_sample_to_np)  # maps each element
)
listed = list(dataset)

target_length = 70


def process_transformer(sample: dict) -> dict:
  tokenized = tokenizer(sample["review"])["input_ids"][:target_length]
  sample["review"] = np.pad(
      tokenized, pad_width=(0, target_length-len(tokenized)))
  return sample


dataset = (
    grain.MapDataset.source(hf_train)
    .shuffle(seed=42)
    .map(process_date)
    .map(process_transformer)
)
third = dataset[2]

dataset = (
    grain.MapDataset.source(hf_train)
    .shuffle(seed=42)
    .filter(lambda x: x["star"] > 3)  # filters samples
    .map(process_date)
    .map(process_transformer)
    .map(process_sample_to_np)
    .to_iter_dataset()
    .batch(batch_size=2)  # batches consecutive elements
)
ds_iter = iter(dataset)
first_batch = next(ds_iter)
rest = list(ds_iter)
"""


def test_huggingface_dataset_tutorial():
  g, l = porting.run_both(HUGGINGFACE_TUTORIAL)
  assert len(l.listed) == len(g.listed) == 40
  assert plain(l.listed) == plain(g.listed)
  assert structure(l.listed[0]) == structure(g.listed[0])
  assert plain(l.third) == plain(g.third) and l.third["review"].shape == (70,)
  assert structure(l.first_batch) == structure(g.first_batch)
  assert plain(l.first_batch) == plain(g.first_batch)
  assert plain(l.rest) == plain(g.rest)
  assert all(s > 3 for b in [l.first_batch, *l.rest] for s in plain(b["star"]))
