import torch


class AttentionStyleGroupNorm(torch.nn.Module):
    """The Diffusers attention-block pattern: tokens → linear → back to an image → group norm, at batch size 1."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(32, 32)
        self.norm = torch.nn.GroupNorm(4, 32)

    def forward(self, image):
        tokens = self.linear(image.view(1, 32, 16).transpose(1, 2))
        return self.norm(tokens.transpose(-1, -2).reshape(1, 32, 4, 4) + image)


def test_group_norm_on_a_view_with_unusual_size_one_strides_matches_eager():
    # PyTorch's CPU kernel rejects this input under AOTAutograd (pytorch/pytorch#124181); the reference kernel copes.
    torch.manual_seed(0)
    model, image = AttentionStyleGroupNorm(), torch.randn(1, 32, 4, 4)
    twin = AttentionStyleGroupNorm()
    twin.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="neuron")
    torch.testing.assert_close(compiled(image), twin(image))
    compiled(image).square().sum().backward()
    twin(image).square().sum().backward()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-5, rtol=1e-5)
