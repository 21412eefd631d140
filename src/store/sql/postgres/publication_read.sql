SELECT published_epoch, visible_epoch FROM kb_publication WHERE job = $1
