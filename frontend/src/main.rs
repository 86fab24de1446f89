//! Entry point of the browser studio (trunk builds this binary to wasm32).

fn main() {
    moe_frontend::start();
}
