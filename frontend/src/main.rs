//! Entry point of the browser studio (scripts/build_web.sh builds this binary to wasm32).

fn main() {
    moe_frontend::start();
}
