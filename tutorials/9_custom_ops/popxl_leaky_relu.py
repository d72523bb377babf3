"""Tutorial 9, PopXL: the user guide's LeakyRelu custom op in a graph, and its gradients.

PopXL's user guide built a C++ ``LeakyRelu`` op with ``cppimport`` and wrapped it in a
Python function that created the op in the current graph. Here the op is the JAX function
registered in ``acme_ops.py`` and the wrapper is one line. ``build_and_run_graph`` is the
guide's program (host load, custom op, host store); ``forward_and_gradients`` puts any of
the tutorial's ops in a subgraph and differentiates it with ``popxl.transforms.autodiff``.

Run: python tutorials/9_custom_ops/popxl_leaky_relu.py [--alpha 0.02] [--input_data -1 2 ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np

import popxl
from popxl import ops, transforms
from tutorials import load_tutorial

acme = load_tutorial("9_custom_ops", "acme_ops.py")


def leaky_relu(x: popxl.Tensor, alpha: float = 0.01) -> popxl.Tensor:
    """Compute the leaky relu element-wise on ``x`` (``torch.nn.LeakyReLU``): the custom op
    ``com.acme::LeakyRelu`` recorded in the current graph."""
    return acme.LEAKY_RELU(x, alpha=alpha)


def build_and_run_graph(
    input_data: float | Sequence[float] | np.ndarray, alpha: float
) -> np.ndarray:
    """The user guide's program: stream ``input_data`` to the device, apply ``leaky_relu``
    and stream the result back."""
    input_array = np.asarray(input_data, np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        in_stream = popxl.h2d_stream(input_array.shape, popxl.float32, name="in_stream")
        a = ops.host_load(in_stream, "a")
        o = leaky_relu(a, alpha=alpha)
        out_stream = popxl.d2h_stream(o.shape, o.dtype, name="out_stream")
        ops.host_store(out_stream, o)
    with popxl.Session(ir, "ipu_model") as session:
        outputs = session.run({in_stream: input_array})
    return outputs[out_stream]


def forward_and_gradients(
    fn: Callable[..., popxl.Tensor | tuple[popxl.Tensor, ...]],
    inputs: Sequence[np.ndarray],
    seeds: Sequence[np.ndarray],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Run ``fn`` on ``inputs`` (as variables) and its gradient graph seeded with ``seeds``
    (one per output): returns the outputs and the gradient of
    ``sum_k sum(output_k * seeds_k)`` with respect to each input."""
    ir = popxl.Ir()
    with ir.main_graph:
        variables = [popxl.variable(x, name=f"x{i}") for i, x in enumerate(inputs)]
        graph = ir.create_graph(fn, *variables)
        info = ops.call_with_info(graph, *variables)
        grad = transforms.autodiff(graph)
        grad_seeds = [popxl.constant(s.astype(np.float32)) for s in seeds]
        gradients = ops.call(grad.graph, *grad_seeds, inputs_dict=grad.inputs_dict(info))
        results = [*info.outputs, *gradients]
        streams = []
        for t in results:
            streams.append(popxl.d2h_stream(t.shape, t.dtype))
            ops.host_store(streams[-1], t)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
    values = [out[s] for s in streams]
    n_out = len(info.outputs)
    return values[:n_out], values[n_out:]


def cube_layer(x: popxl.Tensor, bias: popxl.Tensor) -> tuple[popxl.Tensor, popxl.Tensor]:
    return acme.CUBE(x, bias)


def show_cube_program() -> str:
    """The schedule of a subgraph holding the Cube op and of its autodiff gradient graph."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 3), np.float32), name="x")
        bias = popxl.variable(np.zeros(3, np.float32), name="bias")
        graph = ir.create_graph(cube_layer, x, bias)
        grad = transforms.autodiff(graph)
    return graph.print_schedule() + "\n" + grad.graph.print_schedule()


def main(argv: Sequence[str] | None = None) -> np.ndarray:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=0.02, help="the leaky relu's slope")
    parser.add_argument(
        "--input_data", metavar="X", type=float, nargs="+", default=[-2.0, -0.5, 0.01, 3.0]
    )
    args = parser.parse_args(argv)
    result = build_and_run_graph(args.input_data, args.alpha)
    print("ALPHA param:", args.alpha)
    print("INPUT data:", args.input_data)
    print("OUTPUT result:", result)

    x = np.asarray(args.input_data, np.float32)
    (y,), (dx,) = forward_and_gradients(
        lambda t: leaky_relu(t, alpha=args.alpha), [x], [np.ones_like(x)]
    )
    print("LeakyRelu gradient:", dx)
    print(show_cube_program())
    return result


if __name__ == "__main__":
    main()
