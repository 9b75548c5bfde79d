// The FIFO of waiters of one pool: an intrusive doubly linked list, so a waiter that times out or
// aborts leaves from the middle in O(1) and the queue never holds dead entries.

/** A node of the queue; the queue owns `prev`/`next` while the node is in it. */
export interface WaitNode<T extends WaitNode<T>> {
  prev: T | null;
  next: T | null;
  /** True while the node is in a queue; guards against a second unlink. */
  linked: boolean;
}

export class WaitQueue<T extends WaitNode<T>> {
  #head: T | null = null;
  #tail: T | null = null;
  #size = 0;

  get size(): number {
    return this.#size;
  }

  /** The oldest node, or null. */
  peek(): T | null {
    return this.#head;
  }

  push(node: T): void {
    node.prev = this.#tail;
    node.next = null;
    node.linked = true;
    if (this.#tail) this.#tail.next = node;
    else this.#head = node;
    this.#tail = node;
    this.#size++;
  }

  shift(): T | null {
    const node = this.#head;
    if (node) this.remove(node);
    return node;
  }

  /** Unlinks a node of this queue; false when it was not linked (already gone). */
  remove(node: T): boolean {
    if (!node.linked) return false;
    if (node.prev) node.prev.next = node.next;
    else this.#head = node.next;
    if (node.next) node.next.prev = node.prev;
    else this.#tail = node.prev;
    node.prev = node.next = null;
    node.linked = false;
    this.#size--;
    return true;
  }
}
