"""Tensor image transforms, TrivialAugment ops (checked against Pillow), presets."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from attnlab.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DIGITS_MEAN,
    DIGITS_STD,
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    Resize,
    ToFloat,
    TrivialAugment,
    cifar_eval_transforms,
    cifar_train_transforms,
    digits_transforms,
    load_digits_dataset,
)


def _image(c=3, h=32, w=32, seed=0):
    return torch.randint(0, 256, (c, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _pil(x):
    return Image.fromarray(x.permute(1, 2, 0).numpy())


def _from_pil(im):
    return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1)


# ---------------------------------------------------------------------------- ToFloat / Normalize


def test_to_float_maps_uint8_to_unit_interval():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 3)
    y = ToFloat()(x)
    assert y.dtype == torch.float32
    assert torch.allclose(y.flatten(), torch.tensor([0.0, 0.2, 1.0]))
    assert ToFloat()(y) is y


def test_normalize_numbers():
    x = torch.full((3, 2, 2), 0.5)
    y = Normalize(CIFAR10_MEAN, CIFAR10_STD)(x)
    expected = [(0.5 - 0.4914) / 0.2470, (0.5 - 0.4822) / 0.2435, (0.5 - 0.4465) / 0.2616]
    assert torch.allclose(y[:, 0, 0], torch.tensor(expected))
    batch = Normalize((0.5,), (0.25,))(torch.tensor([[[[1.0]]], [[[0.0]]]]))
    assert batch.flatten().tolist() == [2.0, -2.0]


def test_normalize_rejects_uint8_and_wrong_channels():
    with pytest.raises(ValueError, match="ToFloat"):
        Normalize((0.5,), (0.5,))(torch.zeros(1, 2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="3 channels"):
        Normalize(CIFAR10_MEAN, CIFAR10_STD)(torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="std must be positive"):
        Normalize((0.5,), (0.0,))


def test_digits_constants_match_the_data():
    images = load_digits_dataset("all").images.double() / 255
    assert abs(images.mean().item() - DIGITS_MEAN[0]) < 5e-4
    assert abs(images.std().item() - DIGITS_STD[0]) < 5e-4


# ---------------------------------------------------------------------------- crop / flip / resize


def test_random_crop_with_padding_keeps_size_and_cuts_a_window():
    x = _image()
    out = RandomCrop(32, padding=4)(x)
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    windows = [(t, l) for t in range(9) for l in range(9) if torch.equal(padded[:, t : t + 32, l : l + 32], out)]
    assert windows, "output is not a window of the zero-padded image"


def test_random_crop_on_a_batch_draws_per_image():
    x = _image().expand(16, 3, 32, 32)
    out = RandomCrop(32, padding=4)(x)
    assert out.shape == (16, 3, 32, 32)
    assert len({o.numpy().tobytes() for o in out}) > 1


def test_random_crop_reflect_padding_matches_numpy():
    x = _image(c=2, h=6, w=5)
    out = RandomCrop((10, 9), padding=2, padding_mode="reflect")(x)  # the whole padded image
    expected = np.pad(x.numpy(), ((0, 0), (2, 2), (2, 2)), mode="reflect")
    assert np.array_equal(out.numpy(), expected)


def test_random_crop_fill_value_and_smaller_size():
    out = RandomCrop((3, 4), padding=0)(torch.ones(1, 5, 6))
    assert out.shape == (1, 3, 4)
    whole = RandomCrop(7, padding=1, fill=0.25)(torch.ones(1, 5, 5))
    assert whole[0, 0, 0] == 0.25 and whole[0, 3, 3] == 1.0
    with pytest.raises(ValueError, match="size must fit"):
        RandomCrop(40, padding=2)(torch.ones(1, 32, 32))


def test_random_crop_is_reproducible_under_a_seed():
    x = _image().expand(8, 3, 32, 32)
    torch.manual_seed(5)
    a = RandomCrop(32)(x)
    torch.manual_seed(5)
    b = RandomCrop(32)(x)
    assert torch.equal(a, b)


def test_flip_mirrors_columns_and_twice_is_identity():
    x = _image()
    once = RandomHorizontalFlip(p=1.0)(x)
    assert np.array_equal(once.numpy(), x.numpy()[:, :, ::-1])
    assert torch.equal(RandomHorizontalFlip(p=1.0)(once), x)
    assert torch.equal(RandomHorizontalFlip(p=0.0)(x), x)


def test_flip_on_a_batch_flips_some_images_only():
    x = _image().expand(64, 3, 32, 32)
    out = RandomHorizontalFlip(p=0.5)(x)
    flipped = torch.tensor([torch.equal(o, x[0].flip(-1)) for o in out])
    same = torch.tensor([torch.equal(o, x[0]) for o in out])
    assert torch.all(flipped | same)
    assert 10 < int(flipped.sum()) < 54


def test_resize_shapes_and_dtype():
    x = _image(h=32, w=48)
    assert Resize(16)(x).shape == (3, 16, 24)  # shorter side
    assert Resize((20, 10))(x).shape == (3, 20, 10)
    assert Resize(16)(x).dtype == torch.uint8
    assert Resize((8, 8))(x.float().unsqueeze(0).expand(2, -1, -1, -1)).shape == (2, 3, 8, 8)
    assert Resize(32)(x) is x


def test_resize_keeps_a_constant_image_constant():
    x = torch.full((1, 16, 16), 100, dtype=torch.uint8)
    assert torch.equal(Resize(4)(x), torch.full((1, 4, 4), 100, dtype=torch.uint8))


def test_resize_antialias_averages_fine_detail_away():
    checker = ((torch.arange(18)[:, None] + torch.arange(18)) % 2).float().unsqueeze(0)  # 1-pixel checkerboard
    smooth = Resize(6)(checker)
    aliased = Resize(6, antialias=False)(checker)  # samples land on pixel centres: pure 0s and 1s
    assert float((smooth - 0.5).abs().max()) < 0.2
    assert float((aliased - 0.5).abs().min()) > 0.45


# ---------------------------------------------------------------------------- TrivialAugment


@pytest.mark.parametrize("op", TrivialAugment.OPS)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_trivial_augment_keeps_shape_dtype_and_range(op, dtype):
    x = _image(h=16, w=12)
    x = x if dtype == torch.uint8 else x.float() / 255
    aug = TrivialAugment(ops=[op])
    for _ in range(5):
        out = aug(x)
        assert out.shape == x.shape and out.dtype == dtype
        assert float(out.min()) >= 0 and float(out.max()) <= (255 if dtype == torch.uint8 else 1.0)
    batch = aug(x.unsqueeze(0).expand(4, -1, -1, -1))
    assert batch.shape == (4, 3, 16, 12) and batch.dtype == dtype


def test_trivial_augment_is_reproducible_and_varies():
    x = _image().expand(32, 3, 32, 32)
    torch.manual_seed(1)
    a = TrivialAugment()(x)
    torch.manual_seed(1)
    b = TrivialAugment()(x)
    assert torch.equal(a, b)
    assert len({o.numpy().tobytes() for o in a}) > 10


def test_trivial_augment_grey_images():
    x = _image(c=1, h=8, w=8)
    out = TrivialAugment()(x.unsqueeze(0).expand(20, -1, -1, -1))
    assert out.shape == (20, 1, 8, 8)


def test_trivial_augment_rejects_normalized_floats():
    with pytest.raises(ValueError, match="before Normalize"):
        TrivialAugment()(torch.full((3, 4, 4), -1.0))
    with pytest.raises(ValueError, match="ops must be"):
        TrivialAugment(ops=["blur"])


def _apply(op, x, magnitude, **kw):
    """Run one op at a fixed magnitude on a uint8 image, back to uint8."""
    out = TrivialAugment(**kw).apply(x.float() / 255, op, magnitude)
    return (out * 255).round().clamp(0, 255).to(torch.uint8)


@pytest.mark.parametrize("op", ["brightness", "color", "contrast", "sharpness"])
@pytest.mark.parametrize("magnitude", [-0.7, 0.0, 0.6])
def test_enhance_ops_match_pillow(op, magnitude):
    x = _image(h=12, w=10, seed=3)
    enhancer = {"brightness": ImageEnhance.Brightness, "color": ImageEnhance.Color,
                "contrast": ImageEnhance.Contrast, "sharpness": ImageEnhance.Sharpness}[op]
    expected = _from_pil(enhancer(_pil(x)).enhance(1.0 + magnitude))
    diff = (_apply(op, x, magnitude).int() - expected.int()).abs()
    assert int(diff.max()) <= 2, f"{op} off by {int(diff.max())} levels"


@pytest.mark.parametrize("bits", [8, 5, 2])
def test_posterize_matches_pillow(bits):
    x = _image(seed=4)
    assert torch.equal(_apply("posterize", x, 8 - bits), _from_pil(ImageOps.posterize(_pil(x), bits)))


@pytest.mark.parametrize("threshold", [256, 200, 128, 0])
def test_solarize_matches_pillow(threshold):
    x = _image(seed=5)
    assert torch.equal(_apply("solarize", x, 256 - threshold), _from_pil(ImageOps.solarize(_pil(x), threshold)))


def test_equalize_matches_pillow():
    x = (_image(seed=6).float() * 0.3 + 40).to(torch.uint8)  # a narrow histogram to spread
    assert torch.equal(_apply("equalize", x, 0.0), _from_pil(ImageOps.equalize(_pil(x))))


def test_autocontrast_matches_pillow():
    x = (_image(seed=7).float() * 0.5 + 60).to(torch.uint8)
    diff = (_apply("autocontrast", x, 0.0).int() - _from_pil(ImageOps.autocontrast(_pil(x))).int()).abs()
    assert int(diff.max()) <= 1


def test_rotate_90_turns_counter_clockwise():
    x = _image(h=8, w=8)
    assert torch.equal(_apply("rotate", x, 90.0), torch.rot90(x, 1, dims=(1, 2)))
    assert torch.equal(_apply("rotate", x, -90.0), torch.rot90(x, -1, dims=(1, 2)))


def test_translate_moves_content_and_fills():
    x = _image(h=6, w=7)
    right = _apply("translate_x", x, 2.0)
    assert torch.equal(right[:, :, 2:], x[:, :, :-2]) and int(right[:, :, :2].max()) == 0
    down = _apply("translate_y", x, 1.0, fill=1.0)
    assert torch.equal(down[:, 1:], x[:, :-1]) and int(down[:, 0].min()) == 255


def test_shear_x_shifts_rows_in_proportion_to_height():
    x = _image(h=8, w=16)
    out = _apply("shear_x", x, 0.5)
    # Row centres sit at y = -3.5 .. 3.5 from the middle; rows +-0.5 from it shift by -+0.25 px
    # (rounds to 0 with nearest sampling), rows +-3.5 by -+1.75 (rounds to 2).
    assert torch.equal(out[:, 3], x[:, 3]) or torch.equal(out[:, 4], x[:, 4])
    assert torch.equal(out[:, 7, :-2], x[:, 7, 2:])
    assert torch.equal(out[:, 0, 2:], x[:, 0, :-2])


def test_geometric_ops_at_zero_magnitude_are_identity():
    x = _image(h=9, w=11)
    for op in ("rotate", "shear_x", "shear_y", "translate_x", "translate_y"):
        assert torch.equal(_apply(op, x, 0.0), x), op


# ---------------------------------------------------------------------------- Compose / presets


def test_compose_applies_in_order_and_prints_steps():
    pipeline = Compose([ToFloat(), Normalize((0.5,), (0.5,))])
    out = pipeline(torch.full((1, 2, 2), 255, dtype=torch.uint8))
    assert torch.allclose(out, torch.ones(1, 2, 2))
    assert "ToFloat" in repr(pipeline) and "Normalize(mean=(0.5,)" in repr(pipeline)


def test_cifar_presets():
    x = _image()
    for pipeline in (cifar_train_transforms(), cifar_train_transforms(strong=True), cifar_eval_transforms()):
        out = pipeline(x)
        assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    assert "TrivialAugment" in repr(cifar_train_transforms(strong=True))
    assert "TrivialAugment" not in repr(cifar_train_transforms())
    expected = (x.float() / 255 - torch.tensor(CIFAR10_MEAN).view(3, 1, 1)) / torch.tensor(CIFAR10_STD).view(3, 1, 1)
    assert torch.allclose(cifar_eval_transforms()(x), expected, atol=1e-6)


def test_digits_presets():
    x = torch.full((1, 8, 8), 255, dtype=torch.uint8)
    train, evaluate = digits_transforms(train=True), digits_transforms(train=False)
    assert train(x).shape == (1, 8, 8)
    assert torch.allclose(evaluate(x), torch.full((1, 8, 8), (1 - DIGITS_MEAN[0]) / DIGITS_STD[0]))
    assert "RandomHorizontalFlip" not in repr(train)


def test_crop_padding_zero_leaves_flips_only():
    x = _image()
    flips = cifar_train_transforms(padding=0)
    assert "RandomCrop" not in repr(flips) and "RandomHorizontalFlip" in repr(flips)
    evaluate = cifar_eval_transforms()(x)
    for _ in range(8):  # every output is the image or its mirror: nothing shifted
        out = flips(x)
        assert torch.equal(out, evaluate) or torch.equal(out, evaluate.flip(-1))
    assert "padding=2" in repr(cifar_train_transforms(padding=2))
    assert "RandomCrop" not in repr(digits_transforms(train=True, padding=0))


def test_crop_padding_in_a_recipe():
    from attnlab.recipes import load_recipe

    assert load_recipe("vit-cifar10", ["data.crop_padding=0"]).data.crop_padding == 0
    with pytest.raises(ValueError, match="data.crop_padding applies with data.augment=true"):
        load_recipe("vit-cifar10", ["data.crop_padding=2", "data.augment=false"])
    with pytest.raises(ValueError, match="data.crop_padding must be >= 0; got -1"):
        load_recipe("vit-cifar10", ["data.crop_padding=-1"])
