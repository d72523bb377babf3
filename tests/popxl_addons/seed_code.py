"""User code of the seed tutorial (PopXL + popxl.addons basic concepts), kept unchanged.

Only the dataset loader differs: the tutorial downloads MNIST with torchvision, which the
tests cannot; ``get_mnist_data`` here yields small batches with the same torch-style
methods (``.squeeze()``, ``.float()``, ``.int()``, ``.detach().numpy()``).
"""

# ruff: noqa
from tqdm import tqdm
import numpy as np
from typing import Mapping, Optional
from functools import partial

np.random.seed(42)
import popxl.ops as ops
import popxl_addons as addons
import popxl


class Linear(addons.Module):
    def __init__(self, out_features: int, bias: bool = True):
        super().__init__()
        self.out_features = out_features
        self.bias = bias

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        # add a state variable to the module
        w = self.add_variable_input(
            "weight",
            partial(np.random.normal, 0, 0.02, (x.shape[-1], self.out_features)),
            x.dtype,
        )
        y = x @ w
        if self.bias:
            # add a state variable to the module
            b = self.add_variable_input("bias", partial(np.zeros, y.shape[-1]), x.dtype)
            y = y + b
        return y


def simple_example():
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        # create a variable factory and a graph from the module
        facts, linear_graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        print("factories: \n", facts)
        print("\n graph: \n", linear_graph.print_schedule())
        # since we are in the main graph, we can instantiate variables using the factories
        variables = facts.init()
        print("\n variables: \n", variables)
        # and bind our graph to these variables that live in the main graph.
        bound_graph = linear_graph.bind(variables)
        # the bound graph can be called providing only unnamed inputs x
        input_data = np.asarray(np.random.rand(2, 4)).astype(np.float32)
        input_tensor = popxl.variable(input_data, name="x")
        out = bound_graph.call(input_tensor)

    ir.num_host_transfers = 1
    # Create a session to run your IR
    session = popxl.Session(ir, "ipu_hw")
    # Run the program
    with session:
        session.run()
    return session, variables, input_tensor, out


def multiple_bound_graphs():
    ir = popxl.Ir()
    with ir.main_graph:
        facts, linear_graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        variables1 = facts.init()
        variables2 = facts.init()
        # the same subgraph can be bound to different variables,
        # generating distinct bound graph objects.
        bound_graph1 = linear_graph.bind(variables1)
        bound_graph2 = linear_graph.bind(variables2)
        print("\n two different bound graphs: \n", bound_graph1, bound_graph2)
        input_data = np.asarray(np.random.rand(2, 4)).astype(np.float32)
        input_tensor = popxl.variable(input_data, name="x")
        out = bound_graph1.call(input_tensor)
    return ir, out


class Net(addons.Module):
    def __init__(self, cache: Optional[addons.GraphCache] = None):
        super().__init__(cache=cache)
        self.fc1 = Linear(512)
        self.fc2 = Linear(512)
        self.fc3 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        x = ops.gelu(self.fc2(x))
        x = ops.gelu(self.fc3(x))
        x = self.fc4(x)
        return x


def nested_modules():
    ir = popxl.Ir()
    main = ir.main_graph
    with main:
        facts, net_graph = Net().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
        print(facts.to_dict().keys())
        print("\n", net_graph.print_schedule())


class NetOutlined(addons.Module):
    def __init__(self, cache: Optional[addons.GraphCache] = None):
        super().__init__(cache=cache)
        # first and last layer are not reused
        self.fc1 = Linear(512)
        self.fc4 = Linear(10)

    def build(self, x: popxl.Tensor):
        x = x.reshape((-1, 28 * 28))
        x = ops.gelu(self.fc1(x))
        # create a single subgraph to be used both for fc2 and fc3
        # create variable factories and subgraph
        facts, subgraph = Linear(512).create_graph(x)
        # generate specific named inputs for fc2
        named_tensors_0 = self.add_variable_inputs("fc2", facts)
        # fc2 is a bound graph using the shared, single subgraph and custom params
        fc2 = subgraph.bind(named_tensors_0)
        # generate specific named inputs for fc3
        named_tensors_1 = self.add_variable_inputs("fc3", facts)
        # fc3 is a bound graph using the shared, single subgraph and custom params
        fc3 = subgraph.bind(named_tensors_1)
        (x,) = fc2.call(x)
        x = ops.gelu(x)
        (x,) = fc3.call(x)
        x = ops.gelu(x)
        x = self.fc4(x)
        return x


def outlined():
    ir = popxl.Ir()
    with ir.main_graph:
        args, net_graph = NetOutlined().create_graph(popxl.TensorSpec((28, 28), popxl.float32))
        print(args.to_dict().keys())
        print("\n", net_graph.print_schedule())


def dot_tree_example(input_tensor_data):
    ir = popxl.Ir(replication=1)
    with ir.main_graph:
        input_tensor = popxl.variable(input_tensor_data, name="x")
        facts, linear_graph = Linear(32).create_graph(popxl.TensorSpec((2, 4), popxl.float32))
        variables = facts.init()
        variables2 = facts.init()
        print("----- DotTree functionalities -----\n")
        collection = addons.NamedTensors()  # empty collection
        collection.insert("layer1", variables)  # add a new key with the insert method
        collection.insert("layer2", variables2)
        print("A nested collection: the nested structure appear from the dot structure of names")
        print(collection, "\n")  # nested structure
        print("Each leaf can be accessed with dot syntax: collection.layer1")
        print(collection.layer1)  # each leaf node in the tree can be accessed with dot syntax
        collection_dict = collection.to_dict()  # convert the collection to dictionary
        nt = addons.NamedTensors.from_dict(
            {"x": input_tensor}
        )  # create the collection from a dictionary
        nt_b = addons.NamedTensors.from_dict({"b": variables.bias})
        nt.update(nt_b)  # update the collection with another collection, keys should not repeat
        # print("\n",nt)
        names = ["new_bias_name", "new_weight_name"]
        nt_from_lists = addons.NamedTensors.pack(
            names, variables.tensors
        )  # create the collection from a list
        names, tensors = nt_from_lists.unpack()
        # print("\n",nt_from_lists)
        print("\n")
        # ----- NamedTensors specific -----
        print("----- NamedTensors -----\n")
        print(collection.named_tensors, "\n")  # same as to_dict, specific of NamedTensors
        print("Get only tensors, sorted by name")
        print(collection.tensors)  # returns tensors, sorted by names
    return nt, nt_from_lists, names, tensors, collection_dict


def train_program(batch_size, device, learning_rate):
    ir = popxl.Ir(replication=1)

    with ir.main_graph:
        # Create input streams from host to device
        img_stream = popxl.h2d_stream((batch_size, 28, 28), popxl.float32, "image")
        img_t = ops.host_load(img_stream)  # load data
        label_stream = popxl.h2d_stream((batch_size,), popxl.int32, "labels")
        labels = ops.host_load(label_stream, "labels")

        # Create forward graph
        facts, fwd_graph = Net().create_graph(img_t)

        # Create backward graph via autodiff transform
        bwd_graph = addons.autodiff(fwd_graph)

        # Initialise variables (weights)
        variables = facts.init()

        # Call the forward graph with call_with_info because we want to retrieve
        # information from the call site
        fwd_info = fwd_graph.bind(variables).call_with_info(img_t)
        x = fwd_info.outputs[0]  # forward output

        # Compute loss and starting gradient for backpropagation
        loss, dx = addons.ops.cross_entropy_with_grad(x, labels)

        # Setup a stream to retrieve loss values from the host
        loss_stream = popxl.d2h_stream(loss.shape, loss.dtype, "loss")
        ops.host_store(loss_stream, loss)

        # retrieve activations from the forward graph
        activations = bwd_graph.grad_graph_info.inputs_dict(fwd_info)

        # call the backward graph providing the starting value for backpropagation and activations
        bwd_info = bwd_graph.call_with_info(dx, args=activations)

        # Optimiser: get a mapping between forward tensors and corresponding
        # gradients and use it to update each tensor
        grads_dict = bwd_graph.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(
            fwd_info, bwd_info
        )
        for t in variables.tensors:
            ops.scaled_add_(t, grads_dict[t], b=-learning_rate)

    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [img_stream, label_stream], variables, loss_stream


def test_program(test_batch_size, device):
    ir = popxl.Ir(replication=1)

    with ir.main_graph:
        # Inputs
        in_stream = popxl.h2d_stream((test_batch_size, 28, 28), popxl.float32, "image")
        in_t = ops.host_load(in_stream)

        # Create graphs
        facts, graph = Net().create_graph(in_t)

        # Initialise variables
        variables = facts.init()

        # Forward
        (outputs,) = graph.bind(variables).call(in_t)
        out_stream = popxl.d2h_stream(outputs.shape, outputs.dtype, "outputs")
        ops.host_store(out_stream, outputs)

    ir.num_host_transfers = 1
    return popxl.Session(ir, device), [in_stream], variables, out_stream


def accuracy(predictions: np.ndarray, labels: np.ndarray):
    ind = np.argmax(predictions, axis=-1).flatten()
    labels = labels.detach().numpy().flatten()
    return np.mean(ind == labels) * 100.0


def run_mnist(get_mnist_data, epochs=1):
    train_batch_size = 8
    test_batch_size = 80
    device = "ipu_hw"
    learning_rate = 0.05

    training_data, test_data = get_mnist_data(test_batch_size, train_batch_size)

    train_session, train_input_streams, train_variables, loss_stream = train_program(
        train_batch_size, device, learning_rate
    )

    num_batches = len(training_data)
    with train_session:
        for epoch in range(1, epochs + 1):
            print(f"Epoch {epoch}/{epochs}")
            bar = tqdm(training_data, total=num_batches)
            for data, labels in bar:
                inputs: Mapping[popxl.HostToDeviceStream, np.ndarray] = dict(
                    zip(train_input_streams, [data.squeeze().float(), labels.int()])
                )
                loss = train_session.run(inputs)[loss_stream]
                bar.set_description(f"Loss:{loss:0.4f}")

    train_vars_to_data = train_session.get_tensors_data(train_variables.tensors)

    test_session, test_input_streams, test_variables, out_stream = test_program(
        test_batch_size, device
    )

    # dictionary { train_session variables : test_session variables }
    train_vars_to_test_vars = train_variables.to_mapping(test_variables)

    # Create a dictionary { test_session variables : tensor data (numpy) }
    test_vars_to_data = {
        test_var: train_vars_to_data[train_var].copy()
        for train_var, test_var in train_vars_to_test_vars.items()
    }

    # Copy trained weights to the program, with a single host to device transfer
    test_session.write_variables_data(test_vars_to_data)

    # check that weights have been copied correctly
    test_vars_to_data_after_write = test_session.get_tensors_data(test_variables.tensors)
    for test_var, array in test_vars_to_data_after_write.items():
        assert (array == test_vars_to_data[test_var]).all()

    num_batches = len(test_data)
    sum_acc = 0.0
    with test_session:
        for data, labels in tqdm(test_data, total=num_batches):
            inputs: Mapping[popxl.HostToDeviceStream, np.ndarray] = dict(
                zip(test_input_streams, [data.squeeze().float(), labels.int()])
            )
            output = test_session.run(inputs)
            sum_acc += accuracy(output[out_stream], labels)

    test_set_accuracy = sum_acc / len(test_data)
    print(f"Accuracy on test set: {test_set_accuracy:0.2f}%")
    return test_set_accuracy
