"""Where training batches come from: (latents (N, 4, s, s) on the device, labels (N,) int64).

`synthetic`: seeded random latents drawn on the device (no input pipeline cost); {latents: PATH}:
pre-extracted latents; {images: DIR, vae: ...}: an ImageFolder tree, ADM centre crop + flip, encoded
through the VAE every step; {pixels: ...}: images as latents (`ditbench.models.pixels`).
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import numpy as np
import torch

from ditbench.core.errors import UserError, shorten
from ditbench.files.outpaths import not_a_file
from ditbench.models import vae as vae_lib
from ditbench.models.configs import latent_size
from ditbench.spec.knobs import DATA_HELP


class DataSource:
    """Base: next_batch() -> (x, y) on the device; describe() -> a JSON-able dict for records."""

    batch_size: int

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


class SyntheticLatents(DataSource):
    """N(0, 1) latents and uniform labels drawn on the device from a seeded generator."""

    def __init__(self, batch_size: int, latent_size: int, num_classes: int, device, seed: int = 0):
        self.batch_size = batch_size
        self.shape = (batch_size, vae_lib.LATENT_CHANNELS, latent_size, latent_size)
        self.num_classes = num_classes
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def next_batch(self):
        x = torch.randn(self.shape, device=self.device, generator=self.generator)
        y = torch.randint(
            0, self.num_classes, (self.batch_size,), device=self.device, generator=self.generator
        )
        return x, y

    def describe(self) -> dict:
        return {"kind": "synthetic"}


_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def load_latent_file(path: str | os.PathLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Read (latents float32 (N, C, s, s), labels int64 (N,)) from .npz or .pt, checking shapes."""
    p = Path(path)
    why = not_a_file(p)  # a FIFO or /dev/null named as such, not "does not exist"
    if why is not None:
        raise UserError(f"latent file {str(p)!r} {why}; make one with `ditbench extract-latents`")
    if p.suffix == ".npz":
        try:
            with np.load(p, allow_pickle=False) as f:
                keys = set(f.files)
                if not {"latents", "labels"} <= keys:
                    raise UserError(
                        f"latent file {str(p)!r} has arrays {sorted(keys)}; it needs 'latents' (N, 4, s, s) "
                        "and 'labels' (N,)"
                    )
                latents, labels = torch.from_numpy(f["latents"]), torch.from_numpy(f["labels"])
        except (OSError, ValueError) as err:
            raise UserError(f"latent file {str(p)!r} is not a readable .npz ({err})") from err
    elif p.suffix in (".pt", ".pth"):
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as err:
            raise UserError(f"latent file {str(p)!r} could not be read as a tensor file ({err})") from err
        if not isinstance(obj, dict) or "latents" not in obj or "labels" not in obj:
            raise UserError(f"latent file {str(p)!r} must hold a dict with 'latents' and 'labels' tensors")
        latents, labels = torch.as_tensor(obj["latents"]), torch.as_tensor(obj["labels"])
    else:
        raise UserError(f"latent file {str(p)!r}: expected a .npz or .pt file")
    if latents.ndim != 4 or latents.shape[2] != latents.shape[3]:
        raise UserError(
            f"latent file {str(p)!r}: latents have shape {tuple(latents.shape)}, expected (N, 4, s, s)"
        )
    if labels.ndim != 1 or labels.shape[0] != latents.shape[0]:
        raise UserError(
            f"latent file {str(p)!r}: labels have shape {tuple(labels.shape)}, expected ({latents.shape[0]},)"
        )
    if latents.shape[0] == 0:
        raise UserError(f"latent file {str(p)!r} holds no latents")
    # checked before training: a NaN would fail it at step 2
    if latents.is_complex() or not (latents.is_floating_point() or latents.dtype in _INTS):
        raise UserError(f"latent file {str(p)!r}: latents are {latents.dtype}, expected float32 numbers")
    if latents.is_floating_point():
        finite = torch.isfinite(latents)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            first = int((~finite).flatten(1).any(1).nonzero()[0])
            raise UserError(
                f"latent file {str(p)!r} holds {bad:,} NaN or infinite values (the first in latent {first}); "
                "training on it would fail at its first steps. Re-encode the images with "
                "`ditbench extract-latents`, or drop those latents."
            )
    if labels.is_floating_point():
        if not bool(torch.isfinite(labels).all()) or not bool((labels == labels.round()).all()):
            raise UserError(f"latent file {str(p)!r}: labels must be whole class numbers, not fractions, NaN")
    elif labels.is_complex() or labels.dtype not in _INTS:
        raise UserError(f"latent file {str(p)!r}: labels are {labels.dtype}, expected integer class numbers")
    if int(labels.min()) < 0:
        low = int(labels.min())
        raise UserError(f"latent file {str(p)!r}: labels must be class numbers from 0, got {low}")
    return latents.float(), labels.long()


class StagingBuffers:
    """A ring of pinned (latents, labels) host buffers batches are gathered into: a copy from pageable
    memory (what indexing makes) is synchronous. A slot is reused once the copy that read it is done (an
    event per slot); with two, the host gathers batch k+1 while batch k is on its way."""

    SLOTS = 2

    def __init__(self, x_shape, y_shape, *, pin: bool):
        pinned = functools.partial(torch.empty, pin_memory=pin)
        self.slots = [
            (pinned(x_shape, dtype=torch.float32), pinned(y_shape, dtype=torch.long))
            for _ in range(self.SLOTS)
        ]
        self.events = [torch.cuda.Event() for _ in range(self.SLOTS)]
        self.issued = [False] * self.SLOTS
        self.current = -1

    def gather(self, latents: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor):
        """The rows `idx` of latents and labels, written into the next slot's buffers."""
        self.current = (self.current + 1) % self.SLOTS
        if self.issued[self.current]:
            self.events[self.current].synchronize()  # the copy that last read this slot is done
        x, y = self.slots[self.current]
        torch.index_select(latents, 0, idx, out=x)
        torch.index_select(labels, 0, idx, out=y)
        return x, y

    def copies_issued(self) -> None:
        """Mark, on the current stream, the point after the copies out of the current slot."""
        self.events[self.current].record()
        self.issued[self.current] = True


class LatentFile(DataSource):
    """Random batches (a fresh permutation per epoch) from a file of pre-extracted latents."""

    def __init__(self, path, batch_size: int, latent_size: int, num_classes: int, device, seed: int = 0):
        latents, labels = load_latent_file(path)
        want = (vae_lib.LATENT_CHANNELS, latent_size, latent_size)
        if latents.shape[1:] != want:
            raise UserError(
                f"latent file {str(path)!r} holds latents of shape {tuple(latents.shape[1:])}, but this "
                f"model needs {want} (image_size {latent_size * vae_lib.DOWNSAMPLE}); extract latents at "
                "the matching image size"
            )
        if int(labels.max()) >= num_classes:  # load_latent_file refused negative labels
            raise UserError(
                f"latent file {str(path)!r} has labels in [{int(labels.min())}, {int(labels.max())}], "
                f"outside [0, {num_classes - 1}] for num_classes {num_classes}"
            )
        self.path = str(path)
        self._batches(latents, labels, batch_size, device, seed)

    def _batches(self, latents: torch.Tensor, labels: torch.Tensor, batch_size: int, device, seed: int):
        want = tuple(latents.shape[1:])
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.latents, self.labels = latents, labels
        self.staging = None
        if self.device.type == "cuda":  # gather into pinned memory, so the copy to the GPU is asynchronous
            self.staging = StagingBuffers((batch_size, *want), (batch_size,), pin=True)
        self.generator = torch.Generator().manual_seed(seed)
        self._order = torch.empty(0, dtype=torch.long)  # indices not yet served

    def next_batch(self):
        while len(self._order) < self.batch_size:  # the rest of this epoch's permutation, then the next's
            self._order = torch.cat([self._order, torch.randperm(len(self.labels), generator=self.generator)])
        idx, self._order = self._order[: self.batch_size], self._order[self.batch_size :]
        if self.staging is None:
            return self.latents[idx].to(self.device), self.labels[idx].to(self.device)
        x_host, y_host = self.staging.gather(self.latents, self.labels, idx)
        x = x_host.to(self.device, non_blocking=True)
        y = y_host.to(self.device, non_blocking=True)
        self.staging.copies_issued()
        return x, y

    def describe(self) -> dict:
        return {"kind": "latents", "path": self.path, "count": int(len(self.labels))}


class PixelImages(LatentFile):
    """Images as latents (models/pixels.py: grey 2x2 blocks or one RGB pixel per cell), encoded once."""

    def __init__(
        self, spec: str, batch_size: int, image_size: int, num_classes: int, device, seed=0, colour="grey"
    ):
        from ditbench.models import pixels

        images, labels = pixels.load_pixels(spec, image_size, num_classes, colour)
        self.path, self.colour = spec, colour
        latents = pixels.encode(images) if colour == "grey" else pixels.encode_rgb(images)
        self._batches(latents, torch.from_numpy(labels), batch_size, device, seed)

    def describe(self) -> dict:
        return {"kind": "pixels", "path": self.path, "colour": self.colour, "count": int(len(self.labels))}


def center_crop_arr(pil_image, image_size: int):
    """ADM's centre crop: halve with BOX while the short side is >= 2x the target, resize the short
    side to image_size with BICUBIC, then crop the centre square."""
    from PIL import Image

    while min(*pil_image.size) >= 2 * image_size:
        pil_image = pil_image.resize(tuple(x // 2 for x in pil_image.size), resample=Image.BOX)
    scale = image_size / min(*pil_image.size)
    pil_image = pil_image.resize(tuple(round(x * scale) for x in pil_image.size), resample=Image.BICUBIC)
    arr = np.array(pil_image.convert("RGB"))
    top = (arr.shape[0] - image_size) // 2
    left = (arr.shape[1] - image_size) // 2
    return Image.fromarray(arr[top : top + image_size, left : left + image_size])


def image_folder(root, image_size: int, flip: bool = True):
    """torchvision ImageFolder over `root` with the ADM transform; UserError for a bad tree."""
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    from ditbench.files.imageload import load_rgb

    p = Path(root)
    if not p.is_dir():
        raise UserError(f"image folder {str(p)!r} does not exist or is not a directory")
    steps = [transforms.Lambda(lambda img: center_crop_arr(img, image_size))]
    steps += [transforms.RandomHorizontalFlip()] if flip else []
    steps += [transforms.ToTensor(), transforms.Normalize([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], inplace=True)]
    try:
        # load_rgb: a decompression bomb or a damaged image is refused from its header, naming it
        return ImageFolder(str(p), transform=transforms.Compose(steps), loader=load_rgb)
    except (FileNotFoundError, RuntimeError) as err:
        raise UserError(
            f"image folder {str(p)!r} is not an ImageFolder tree: it needs one subfolder per class holding "
            f"images ({err})"
        ) from err


class ImageFolderVAE(DataSource):
    """Images decoded, cropped, flipped and encoded through the VAE for every batch."""

    def __init__(
        self,
        root,
        vae_spec,
        batch_size: int,
        image_size: int,
        num_classes: int,
        device,
        seed: int = 0,
        num_workers: int = 0,
    ):
        vae_lib.require_vae_spec(vae_spec)
        self.root = str(root)
        self.batch_size = batch_size
        self.device = torch.device(device)
        self.dataset = image_folder(root, image_size, flip=True)
        if len(self.dataset) == 0:
            raise UserError(f"image folder {self.root!r} holds no images")
        n_cls = len(self.dataset.classes)
        if n_cls > num_classes:
            raise UserError(
                f"image folder {self.root!r} has {n_cls} class folders but the model has num_classes "
                f"{num_classes}"
            )
        self.vae, self.vae_desc = vae_lib.build_vae(vae_spec, self.device)
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=batch_size,
            shuffle=True,
            drop_last=len(self.dataset) >= batch_size,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(seed),
            pin_memory=self.device.type == "cuda",
            persistent_workers=num_workers > 0,
        )
        # Endless: a new epoch (a new shuffle) whenever one ends.
        self._batches = (batch for _ in itertools.count() for batch in self.loader)

    def next_batch(self):
        # The random flip draws from torch's global RNG, which the Trainer seeds: runs repeat.
        images, labels = next(self._batches)
        images = images.to(self.device, non_blocking=True)
        x = vae_lib.encode_images(self.vae, images)
        return x, labels.to(self.device, non_blocking=True)

    def describe(self) -> dict:
        return {"kind": "images", "path": self.root, "count": len(self.dataset), "vae": self.vae_desc}


def data_spec(spec, vae: str | None = None):
    """The suite form of `ditbench train --data` (`synthetic`, an image folder or a latent file)."""
    if spec == "synthetic":
        return spec
    p = Path(spec)
    if p.is_dir():
        vae_lib.require_vae_spec(vae)
        return {"images": str(p), "vae": str(vae)}
    if p.suffix in (".npz", ".pt", ".pth"):
        return {"latents": str(p)}
    raise UserError(f"data {str(spec)!r} is neither 'synthetic', an image folder, nor a .npz/.pt latent file")


def data_source_from_config(
    spec,
    *,
    batch_size: int,
    image_size: int,
    num_classes: int = 1000,
    device="cpu",
    seed: int = 0,
    num_workers: int = 0,
) -> DataSource:
    """The data source of a `data` knob as spec.knobs validates it."""
    size = latent_size(image_size)
    if spec == "synthetic":
        return SyntheticLatents(batch_size, size, num_classes, device, seed)
    keys = set(spec) if isinstance(spec, dict) else set()
    if keys == {"latents"}:
        return LatentFile(spec["latents"], batch_size, size, num_classes, device, seed)
    if "pixels" in keys and keys <= {"pixels", "colour"}:
        from ditbench.models.pixels import colour_of

        return PixelImages(spec["pixels"], batch_size, image_size, num_classes, device, seed, colour_of(spec))
    if "images" in keys and keys <= {"images", "vae"}:
        return ImageFolderVAE(
            spec["images"], spec.get("vae"), batch_size, image_size, num_classes, device, seed, num_workers
        )
    raise UserError(f"data {shorten(spec)} is not valid; use {DATA_HELP}")
